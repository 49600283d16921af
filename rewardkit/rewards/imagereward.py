"""ImageReward (Xu et al. 2023): BLIP ViT-L/16 image tokens cross-attended by BLIP's BERT text encoder, the
``[CLS]`` feature into an activation-free MLP, trained on 137k expert comparisons.

``score = (MLP(text_encoder([CLS] prompt, cross-attending ViT(image))[:, 0]) - 0.16717) / 1.03334``, the
published normalisation, so scores are roughly standardised (about -2..2; real generations mostly -1..1.5).
``normalize=False`` returns the raw MLP output. Preprocessing is ImageReward's (OpenAI CLIP transform at 224:
bicubic shorter side, centre crop); prompts are padded / truncated to 35 tokens as upstream.

Differentiable: ``reward.score_tensor(images, prompts)`` runs the torch port of that transform
(:func:`rewardkit.models.zoo.openai_clip_pixel_values`: same sizes and crop, PIL's bicubic kernel in fp32);
ordinary calls keep the PIL recipe. Residual difference (PIL's 8-bit fixed-point resampling vs fp32) on 8-bit
natural-like images of aspect ratios 1:4 to 4:1: pre-processed pixels within 0.0042 (max; [0, 1] units) and
0.0012 (mean); normalised scores within 2.2e-4 on the tiny model (``tests/rewards/test_zoo_gradients.py`` asserts 3e-4).

Convert the official ``ImageReward.pt`` once (read with the weights-only unpickler)::

    rewardkit convert imagereward ImageReward.pt imagereward/ [--med-config med_config.json]
    load_reward("imagereward", model="imagereward/")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput

#: prompts whose token rows are kept (then the cache starts over)
TOKEN_ROWS_KEPT = 4096


@dataclass
class ImageRewardConfig(RewardConfig):
    model: str = ""          # directory written by `rewardkit convert imagereward`
    device: str | None = None
    dtype: str = "float32"
    batch_size: int = 16
    normalize: bool = True   # the published (r - mean) / std
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


class ImageReward(Reward):
    """ImageReward-v1.0: BLIP image-text features into an MLP, normalised human-preference score."""

    name: ClassVar[str] = "imagereward"
    tasks = frozenset({"t2i"})
    extras = ("hf",)
    score_range = None
    dimensions = ("raw",)
    thread_safe = False  # one tokenizer; the base class serialises calls
    differentiable = True  # score_tensor: the torch port of the OpenAI CLIP transform
    scores_empty_prompt = True  # as the official package: an empty prompt is a legitimate (unconditional) input
    Config = ImageRewardConfig

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        from pathlib import Path

        from .._imports import require
        from ..convert._io import read_manifest
        from ..models.vlm import from_pretrained_safetensors, resolve_device, resolve_dtype
        from ..models.zoo import RatingMLP

        cfg = self.config
        if not cfg.model:
            raise ValueError("imagereward needs model=<directory written by `rewardkit convert imagereward "
                             "ImageReward.pt DIR`>")
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        self.manifest = man = read_manifest(cfg.model, "imagereward")
        transformers = require("transformers", "hf", purpose="the imagereward reward")
        st = require("safetensors.torch", "hf")
        root = Path(cfg.model)
        dt = resolve_dtype(cfg.dtype)
        self._device = resolve_device(cfg.device)
        self.vision = from_pretrained_safetensors(transformers.BlipVisionModel, str(root / "vision"), dtype=dt)
        self.text = from_pretrained_safetensors(transformers.BlipTextModel, str(root / "text"), dtype=dt,
                                                add_pooling_layer=False)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(root / "tokenizer"))
        h = man["head"]
        self.head = RatingMLP(int(h["in_features"]), h["activation"], widths=h["widths"]).float()
        self.head.load_state_dict(st.load_file(str(root / h["file"])), strict=True)
        self.mean, self.std = float(man["normalization"]["mean"]), float(man["normalization"]["std"])
        self.max_length = int(man.get("max_length", 35))
        self.image_size = int(self.vision.config.image_size)
        for m in (self.vision, self.text, self.head):
            m.to(self._device).eval().requires_grad_(False)  # frozen: gradients go to pixels only
        self.default_batch_size = cfg.batch_size

    @property
    def supports_score_tensor(self) -> bool:
        return True  # calls stay on the PIL recipe; score_tensor runs its torch port

    def _image_processors(self) -> list:
        # no Hugging Face processor: declare the recipe's resize (shorter side to image_size) so the size
        # checks of calls and score_tensor refuse images whose resize would exceed the pixel limit
        from types import SimpleNamespace

        found = self.__dict__.get("_found_image_processors")  # built once: the size checks ask per image
        if found is None:
            found = self.__dict__["_found_image_processors"] = [
                SimpleNamespace(do_resize=True, size={"shortest_edge": self.image_size})]
        return found

    def _official_rgb(self, im):
        from ..models.zoo import official_openai_clip_rgb

        return official_openai_clip_rgb(im, self.image_size)  # resize and crop as opened, then RGB

    def _token_rows(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """BERT ``input_ids`` / ``attention_mask`` ``[B, max_length]`` (padded to the window, as upstream), each
        prompt's row tokenized once and kept (the same rows as one tokenizer call on the batch)."""
        cache = self.__dict__.setdefault("_tok_rows", {})
        missing = [p for p in dict.fromkeys(prompts) if p not in cache]
        if missing and len(cache) + len(missing) > TOKEN_ROWS_KEPT:
            cache.clear()
            missing = list(dict.fromkeys(prompts))
        if missing:
            enc = self.tokenizer(missing, padding="max_length", truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
            for i, p in enumerate(missing):
                cache[p] = (enc["input_ids"][i], enc["attention_mask"][i])
        rows = [cache[p] for p in prompts]
        return {"input_ids": torch.stack([r[0] for r in rows]), "attention_mask": torch.stack([r[1] for r in rows])}

    def raw_scores(self, pixels: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """Raw MLP outputs ``[B]`` (fp32) for preprocessed pixels ``[B, 3, S, S]`` and B prompts."""
        from ..models.direct_forward import blip_text_states, blip_vision_states

        dev, dt = self._device, next(self.vision.parameters()).dtype
        img = blip_vision_states(self.vision, pixels.to(dev, dt))  # [B, 1 + N, Wv], the stock call's values
        enc = self._token_rows(prompts)
        # bidirectional (BLIP's "multimodal" mode), every image token attended: the stock call's [CLS] row within
        # float rounding (the last layer runs that row only)
        states = blip_text_states(self.text, enc["input_ids"].to(dev), enc["attention_mask"].to(dev), img,
                                  first_only=True)  # [B, 1, Wt]: the [CLS] row only
        feats = states[:, 0].float()  # [B, Wt], the [CLS] position
        with torch.autocast(device_type=feats.device.type, enabled=False):
            return self.head(feats)[:, 0]

    def _score(self, batch: RewardBatch) -> RewardOutput:
        from ..models.zoo import openai_clip_pixel_values, openai_clip_pixels

        if isinstance(batch.images, torch.Tensor):  # score_tensor: float [B, 3, H, W], differentiable
            pixels = openai_clip_pixel_values(batch.images.to(self._device), self.image_size)
        else:
            pixels = openai_clip_pixels(batch.images, self.image_size)
        raw = self.raw_scores(pixels, batch.prompts)  # on the device (RewardOutput moves non-grad scores)
        scores = (raw - self.mean) / self.std if self.config.normalize else raw
        return RewardOutput(scores=scores, dimensions={"raw": raw},
                            info={"model": self.config.model, "normalize": self.config.normalize})

    def _compare_values(self, out: RewardOutput) -> torch.Tensor:
        return out.scores

    @classmethod
    def tiny(cls, workdir: str) -> "ImageReward":
        from pathlib import Path

        from ..convert import convert
        from ..convert.tiny import save_tiny_bert_tokenizer, write_tiny_imagereward

        root = Path(workdir)
        out = root / "tiny-imagereward"
        if not (out / "rewardkit.json").is_file():
            tok = save_tiny_bert_tokenizer(root / "tiny-bert-tokenizer")
            src = write_tiny_imagereward(root / "ir" / "ImageReward.pt", tokenizer_dir=tok)
            convert("imagereward", src, out, tokenizer=str(tok), vision_heads=2,
                    med_config=root / "ir" / "med_config.json")
        return cls(model=str(out), device="cpu")
