"""CLIPScore: CLIP image-text cosine similarity.

Scale conventions (``convention=``):

- ``"hessel"`` (default): ``2.5 * max(cos, 0)``, the CLIP-S of Hessel et al. 2021 ("CLIPScore: A
  Reference-free Evaluation Metric for Image Captioning"), range [0, 2.5]. Hessel et al. used ViT-B/32
  (our default checkpoint) and prepended ``"A photo depicts "`` to captions; set ``text_prefix`` to match
  their numbers exactly. torchmetrics' ``CLIPScore`` reports ``100 * max(cos, 0)`` instead.
- ``"cosine"``: the raw cosine in [-1, 1] (no clipping: an RL signal keeps its sign).
- ``"logits100"``: ``logit_scale.exp() * cos / 100``, the convention of RL repositories (flow_grpo's
  CLIP scorer divides CLIP's ``logits_per_image`` by 100). For OpenAI CLIP ``logit_scale.exp() == 100``, so
  this equals ``cosine``; for checkpoints with another learned scale it differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..reward import RewardBatch, RewardOutput
from ._clip_base import CLIPReward, CLIPRewardConfig

_RANGES = {"hessel": (0.0, 2.5), "cosine": (-1.0, 1.0), "logits100": None}


@dataclass
class CLIPScoreConfig(CLIPRewardConfig):
    model: str = "openai/clip-vit-base-patch32"
    convention: str = "hessel"
    text_prefix: str = ""
    batch_size: int = 64
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


class CLIPScore(CLIPReward):
    """CLIP image-text similarity (CLIPScore, Hessel et al. 2021)."""

    name: ClassVar[str] = "clipscore"
    score_range = (0.0, 2.5)
    Config = CLIPScoreConfig
    VARIANTS = {
        "clip-vit-base-patch32": "openai/clip-vit-base-patch32",  # Hessel et al. 2021
        "clip-vit-large-patch14": "openai/clip-vit-large-patch14",  # flow_grpo's CLIP reward
    }

    def _check_config(self) -> None:
        if self.config.convention not in _RANGES:
            raise ValueError(f"convention must be one of {sorted(_RANGES)}, got {self.config.convention!r}")
        self.score_range = _RANGES[self.config.convention]

    def _score(self, batch: RewardBatch) -> RewardOutput:
        prompts = [self.config.text_prefix + p for p in batch.prompts]
        cos, truncated = self.backbone.cosine(batch.images, prompts)
        if self.config.convention == "hessel":
            scores = 2.5 * cos.clamp(min=0)
        elif self.config.convention == "logits100":
            scores = cos * self.backbone.logit_scale / 100.0
        else:
            scores = cos
        return RewardOutput(scores=scores, dimensions={"cosine": cos},
                            info={"model": self.config.model, "convention": self.config.convention,
                                  "prompts_truncated": truncated})

    @classmethod
    def tiny(cls, workdir: str) -> "CLIPScore":
        from ..testing import save_tiny_checkpoint

        return cls(model=str(save_tiny_checkpoint("clip", f"{workdir}/tiny-clip")), device="cpu")
