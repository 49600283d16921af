"""LAION aesthetic predictor v2 (Schuhmann et al.): an MLP on CLIP ViT-L/14 image embeddings, regressed on
AVA mean ratings, so scores sit on the 1-10 rating scale (most images 4-7; not clipped). The prompt is not
used.

``score = MLP(normalize(CLIP_L14.get_image_features(image)))`` with OpenAI CLIP's preprocessing (bicubic
shorter side to 224, centre crop). Two published heads: ``sac+logos+ava1-l14-linearMSE.pth`` (no
activations, the one everyone uses) and ``...-reluMSE.pth``. Convert once::

    rewardkit convert aesthetic sac+logos+ava1-l14-linearMSE.pth aesthetic/ [--clip openai/clip-vit-large-patch14]
    load_reward("aesthetic", model="aesthetic/")

Upstream runs CLIP in fp16 on GPU (``clip.load``); here the default is fp32 (``dtype=`` to change).

Pre-processing is OpenAI CLIP's own transform (``clip.load``'s ``preprocess``, what upstream's
``simple_inference.py`` uses), not the Hugging Face processor saved with the CLIP weights: the two differ in
the crop offset rounding. Ordinary calls run it on PIL (:func:`rewardkit.models.zoo.openai_clip_pixels`).

Differentiable: ``reward.score_tensor(images)`` runs its torch port
(:func:`rewardkit.models.zoo.openai_clip_pixel_values`: same sizes and crop, PIL's bicubic kernel in fp32).
Residual difference to the ordinary call (PIL's 8-bit fixed-point resampling vs fp32), on 8-bit natural-like
images of aspect ratios 1:4 to 4:1: pre-processed pixels within 0.0042 (max; [0, 1] units) and 0.0012 (mean),
isolated pixels up to ~0.05 on sharp-edged tall images; scores within 7e-5 on the tiny model
(``tests/rewards/test_zoo_gradients.py`` asserts 1e-4). Ordinary calls always take the PIL route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..reward import RewardBatch, RewardOutput
from ._clip_base import CLIPReward, CLIPRewardConfig


@dataclass
class AestheticConfig(CLIPRewardConfig):
    model: str = ""          # directory written by `rewardkit convert aesthetic`
    batch_size: int = 32
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


class Aesthetic(CLIPReward):
    """LAION aesthetic predictor v2: MLP on normalised CLIP ViT-L/14 image embeddings, 1-10 scale."""

    name: ClassVar[str] = "aesthetic"
    uses_prompt = False
    score_range = None  # nominally 1-10 (AVA ratings), but a regression output is not bounded
    Config = AestheticConfig
    own_preprocessing = True  # OpenAI CLIP's transform (torchvision crop rounding), not the HF processor's
    differentiable = True  # score_tensor: the torch port of that transform

    def _check_config(self) -> None:
        from ..convert._io import read_manifest

        if not self.config.model:
            raise ValueError("aesthetic needs model=<directory written by `rewardkit convert aesthetic "
                             "sac+logos+ava1-l14-linearMSE.pth DIR`>")
        self.manifest = read_manifest(self.config.model, "aesthetic")

    def _processor_for(self, model: str) -> str:
        return self.config.processor or model

    def _official_rgb(self, im):
        from ..models.zoo import official_openai_clip_rgb

        return official_openai_clip_rgb(im, self._image_size)

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        from pathlib import Path

        from safetensors.torch import load_file

        from ..models.zoo import RatingMLP

        h = self.manifest["head"]
        self.head = RatingMLP(int(h["in_features"]), h["activation"], widths=h["widths"]).float().eval()
        self.head.load_state_dict(load_file(str(Path(self.config.model) / h["file"])), strict=True)
        self.head.to(self._device).requires_grad_(False)  # frozen: score_tensor's gradients go to pixels only
        # read once: a transformers config attribute costs microseconds per read, and both are per-image paths
        self._image_size = int(self.backbone.model.config.vision_config.image_size)

    def to(self, device):
        super().to(device)
        self.head.to(self._device)
        return self

    def _score(self, batch: RewardBatch) -> RewardOutput:
        import torch

        from ..models.zoo import clip_image_embeddings, openai_clip_pixel_values, openai_clip_pixels

        size = self._image_size
        if isinstance(batch.images, torch.Tensor):  # score_tensor: float [B, 3, H, W], differentiable
            pixels = openai_clip_pixel_values(batch.images.to(self._device), size)
        else:
            pixels = openai_clip_pixels(batch.images, size)
        emb = clip_image_embeddings(self.backbone.model, pixels)
        with torch.autocast(device_type=emb.device.type, enabled=False):
            scores = self.head(emb.to(self._device).float())[:, 0]
        return RewardOutput(scores=scores, info={"model": self.config.model,
                                                       "variant": self.manifest.get("variant")})

    @classmethod
    def tiny(cls, workdir: str) -> "Aesthetic":
        from pathlib import Path

        from ..convert import convert
        from ..convert.tiny import write_tiny_aesthetic
        from ..testing import save_tiny_checkpoint

        root = Path(workdir)
        out = root / "tiny-aesthetic"
        if not (out / "rewardkit.json").is_file():
            clip = save_tiny_checkpoint("clip", root / "tiny-clip-l14")
            src = write_tiny_aesthetic(root / "sac+logos+ava1-l14-linearMSE.pth", in_features=16)
            convert("aesthetic", src, out, clip=str(clip))
        return cls(model=str(out), device="cpu")
