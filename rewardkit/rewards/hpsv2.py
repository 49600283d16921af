"""HPSv2 / HPSv2.1 (Wu et al. 2023, "Human Preference Score v2"): an OpenCLIP ViT-H-14 fine-tuned on HPDv2.

``score = cos(image, prompt)``, the cosine of the L2-normalised image and text embeddings, exactly what
``hpsv2.score(...)`` returns (about 0.2-0.35 for real images). The HPSv2 benchmark tables report ``100 *
cosine`` (e.g. 27.5): pass ``scale=100`` to get that convention. Images go through HPSv2's own
preprocessing (longest side to 224, bicubic, centred zero pad; not CLIP's centre crop), see
:func:`rewardkit.models.zoo.hpsv2_pixel_values`.

Differentiable: ``reward.score_tensor(images, prompts)`` runs the same recipe in torch on a float
``[B, 3, H, W]`` tensor (HPSv2 itself resizes the float tensor after ``ToTensor``, so the recipe is torch
already); it differs from the ordinary call only by the 8-bit rounding of the input that the call's decoding
adds: identical pixels and scores for ``k / 255`` values (measured difference 0 on the tiny model), and for other
floats the input's 8-bit rounding (at most 0.5 / 255 per input pixel; cosine differences up to 2e-4 measured).
Ordinary calls always take the PIL route.

Prompts are cleaned as HPSv2's tokenizer (OpenCLIP's ``SimpleTokenizer``) cleans them before BPE: ``ftfy.fix_text``,
HTML entities unescaped twice, whitespace runs collapsed (:func:`rewardkit.models.clip.openclip_clean`), so curly
quotes, ``&amp;`` and mojibake give the token ids the model saw.

Weights: convert the official file once, offline (the runtime reads safetensors only)::

    rewardkit convert hpsv2 HPS_v2.1_compressed.pt hpsv2.1/
    load_reward("hpsv2", model="hpsv2.1/")

(``HPS_v2_compressed.pt`` for v2.0; the 8 GB ``HPS_v2.pt`` holds numpy objects and is refused.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..reward import RewardBatch, RewardOutput
from ._clip_base import CLIPReward, CLIPRewardConfig


@dataclass
class HPSv2Config(CLIPRewardConfig):
    model: str = ""          # directory written by `rewardkit convert hpsv2`
    scale: float = 1.0       # 100 = the leaderboard convention (27.xx)
    batch_size: int = 16
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


class HPSv2(CLIPReward):
    """HPSv2 / HPSv2.1 human-preference score: cosine of OpenCLIP ViT-H-14 embeddings (x scale)."""

    name: ClassVar[str] = "hpsv2"
    score_range = (-1.0, 1.0)
    dimensions = ("cosine",)
    Config = HPSv2Config
    own_preprocessing = True  # HPSv2's resize-longest + pad, not the processor's centre crop
    text_cleaning = "openclip"  # HPSv2's tokenizer (OpenCLIP's) runs ftfy + HTML unescape + whitespace first
    differentiable = True  # score_tensor: the same recipe on the caller's float tensor

    def _check_config(self) -> None:
        from ..convert._io import read_manifest

        cfg = self.config
        if not cfg.model:
            raise ValueError("hpsv2 needs model=<directory written by `rewardkit convert hpsv2 "
                             "HPS_v2.1_compressed.pt DIR`>")
        if not (cfg.scale > 0):
            raise ValueError(f"scale must be > 0, got {cfg.scale!r}")
        self.manifest = read_manifest(cfg.model, "hpsv2")
        self.score_range = (-float(cfg.scale), float(cfg.scale))

    def _processor_for(self, model: str) -> str:
        return self.config.processor or model

    def _image_processors(self) -> list:
        # the size checks follow HPSv2's own resize (longest side to the model's size), not the saved CLIP
        # processor's shortest-edge rule (which would over-estimate the resized size of long images)
        from types import SimpleNamespace

        found = self.__dict__.get("_found_image_processors")  # built once: the size checks ask per image
        if found is None:
            found = self.__dict__["_found_image_processors"] = [
                SimpleNamespace(do_resize=True, size={"longest_edge": self._image_size})]
        return found

    def _check_resized_size(self, w: int, h: int) -> None:
        """The base rules, plus HPSv2's own limit: a side that would round to 0 pixels after the longest-side
        resize (aspect ratio over 2 x the model's size, reachable when the aspect-ratio bound is raised) is
        that sample's error, not the chunk's."""
        from .. import media
        from ..models.zoo import hpsv2_resize_shape

        super()._check_resized_size(w, h)
        try:
            hpsv2_resize_shape(h, w, self._image_size)
        except ValueError as exc:
            raise media._Bad(str(exc)) from None

    @property
    def _image_size(self) -> int:
        """The model's input side, read once: a transformers config attribute costs microseconds per read, and
        the size checks read it per image."""
        size = self.__dict__.get("_image_size_cached")
        if size is None:
            size = self.__dict__["_image_size_cached"] = int(self.backbone.model.config.vision_config.image_size)
        return size

    def _official_rgb(self, im):
        from ..models.zoo import official_hpsv2_rgb

        return official_hpsv2_rgb(im)  # RGBA: refused, the official call crashes on it

    def _score(self, batch: RewardBatch) -> RewardOutput:
        from ..models.zoo import clip_image_embeddings, hpsv2_pixel_values, hpsv2_pixels

        uniq = list(dict.fromkeys(batch.prompts))
        text_emb, truncated = self.backbone.embed_texts(uniq)
        idx = torch.tensor([uniq.index(p) for p in batch.prompts], device=text_emb.device)
        size = self._image_size
        if isinstance(batch.images, torch.Tensor):  # score_tensor: float [B, 3, H, W], differentiable
            pixels = hpsv2_pixel_values(batch.images.to(self._device), size)
        else:
            pixels = hpsv2_pixels(batch.images, size)
        img_emb = clip_image_embeddings(self.backbone.model, pixels)
        cos = (img_emb * text_emb[idx]).sum(-1)  # stays on the device for score_tensor (RewardOutput moves it)
        return RewardOutput(scores=cos * float(self.config.scale), dimensions={"cosine": cos},
                            info={"model": self.config.model, "version": self.manifest.get("variant"),
                                  "scale": self.config.scale, "prompts_truncated": truncated})

    @classmethod
    def tiny(cls, workdir: str) -> "HPSv2":
        from pathlib import Path

        from ..convert import convert
        from ..convert.tiny import save_tiny_clip_tokenizer, write_tiny_hpsv2

        root = Path(workdir)
        out = root / "tiny-hpsv2"
        if not (out / "rewardkit.json").is_file():
            tok = save_tiny_clip_tokenizer(root / "tiny-clip-tokenizer")
            src = write_tiny_hpsv2(root / "HPS_v2.1_compressed.pt", tokenizer_dir=tok)
            convert("hpsv2", src, out, tokenizer=str(tok), vision_heads=2, text_heads=2)
        return cls(model=str(out), device="cpu")
