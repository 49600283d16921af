"""PickScore (Kirstain et al. 2023): a CLIP-H/14 fine-tuned on Pick-a-Pic human preferences.

``score = logit_scale.exp() * cos(image, prompt)``, exactly the PickScore repository's formula (its
``logit_scale.exp()`` is about 100, so scores of real images sit near 18-23). Softmax over the scores of
several images for one prompt gives PickScore's preference probabilities; ``compare`` does this for two
images (``sigmoid(s_a - s_b)`` is the two-way softmax). flow_grpo divides the score by 26 to get roughly
[0, 1]; pass ``scale=0.03846`` (1/26) to reproduce that.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..reward import RewardBatch, RewardOutput
from ._clip_base import CLIPReward, CLIPRewardConfig

DEFAULT_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"  # PickScore_v1 ships no processor files


@dataclass
class PickScoreConfig(CLIPRewardConfig):
    model: str = "yuvalkirstain/PickScore_v1"
    # processor default: the model directory if it has processor files, else the CLIP-H processor
    scale: float = 1.0
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


class PickScore(CLIPReward):
    """PickScore_v1: human-preference CLIP-H score, logit_scale * cosine."""

    name: ClassVar[str] = "pickscore"
    score_range = None
    Config = PickScoreConfig
    VARIANTS = {"pickscore-v1": "yuvalkirstain/PickScore_v1"}

    def _processor_for(self, model: str) -> str:
        if self.config.processor is not None:
            return self.config.processor
        local = Path(model)
        has_proc = local.is_dir() and any((local / f).exists() for f in
                                          ("preprocessor_config.json", "processor_config.json"))
        return model if has_proc else DEFAULT_PROCESSOR

    def _score(self, batch: RewardBatch) -> RewardOutput:
        cos, truncated = self.backbone.cosine(batch.images, batch.prompts)
        scores = self.backbone.logit_scale * cos * self.config.scale
        return RewardOutput(scores=scores, info={"model": self.config.model, "prompts_truncated": truncated})

    @classmethod
    def tiny(cls, workdir: str) -> "PickScore":
        from ..testing import save_tiny_checkpoint

        return cls(model=str(save_tiny_checkpoint("clip", f"{workdir}/tiny-pickscore")), device="cpu")
