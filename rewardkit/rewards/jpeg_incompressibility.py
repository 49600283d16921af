"""JPEG incompressibility: the file size of the image saved as JPEG, DDPO's first reward (Black et al. 2023); the
size rule and the config that :mod:`rewardkit.rewards.jpeg_compressibility` (flow_grpo's / DiffusionNFT's
``jpeg_compressibility``) shares.

Both hosts compute it the same way (kvablack/ddpo-pytorch @ 1958463 ``ddpo_pytorch/rewards.py:7-29``;
yifan123/flow_grpo @ ac4c86e ``flow_grpo/rewards.py:7-29``; NVlabs/DiffusionNFT @ 24af555
``flow_grpo/rewards.py:8-30``): a float image in [0, 1] becomes uint8 by ``(x * 255).round().clamp(0, 255)``, PIL
saves it with ``format="JPEG", quality=95`` (PIL's other defaults: 4:2:0 subsampling, no optimisation), and the
size is ``buffer.tell() / 1000``, **kilobytes of 1000 bytes**.

- ``jpeg_incompressibility`` = ``+size_kB`` (both hosts).
- ``jpeg_compressibility`` = ``-size_kB / divisor``: DDPO's ``divisor`` is 1 (``rewards.py:26``), flow_grpo's and
  DiffusionNFT's is 500 (``rewards.py:27`` / ``:28``). rewardkit's default is DDPO's; the flow_grpo drop-in
  (:mod:`rewardkit.integrations.flow_grpo`) builds it with ``divisor=500``.

The size depends on the installed libjpeg (Pillow's bundled libjpeg-turbo gives the same bytes across platforms
for the same version); it is a property of the file, not a model, so there is nothing to download.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput

__all__ = ["JpegIncompressibility", "JpegConfig", "jpeg_size_kb"]


def jpeg_size_kb(image: Any, quality: int = 95) -> float:
    """Size in kilobytes (1000 bytes) of ``image`` (an RGB PIL image) saved by PIL as JPEG at ``quality``."""
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=int(quality))
    return buf.tell() / 1000


@dataclass
class JpegConfig(RewardConfig):
    #: PIL's JPEG quality (both hosts: 95)
    quality: int = 95
    #: the score is sign * size_kB / divisor (compressibility: DDPO 1, flow_grpo / DiffusionNFT 500; the hosts'
    #: incompressibility: 1)
    divisor: float = 1.0


class JpegIncompressibility(Reward):
    """``+size_kB`` of the image saved as JPEG at quality 95 (DDPO / flow_grpo ``jpeg_incompressibility``)."""

    name: ClassVar[str] = "jpeg-incompressibility"
    uses_prompt = False
    thread_safe = True
    default_batch_size = 64
    Config = JpegConfig
    sign: ClassVar[float] = 1.0

    def __init__(self, config=None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        q, d = self.config.quality, self.config.divisor
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100:
            raise ValueError(f"quality must be an integer in [1, 100], got {q!r}")
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not (math.isfinite(d) and d > 0):
            raise ValueError(f"divisor must be a finite number > 0, got {d!r}")

    def _score(self, batch: RewardBatch) -> RewardOutput:
        sizes = [jpeg_size_kb(im, self.config.quality) for im in batch.images]
        scale = self.sign / float(self.config.divisor)
        return RewardOutput(scores=torch.tensor([scale * s for s in sizes], dtype=torch.float64),
                            dimensions={"size_kb": torch.tensor(sizes, dtype=torch.float64)},
                            info={"quality": self.config.quality, "divisor": float(self.config.divisor)})

    dimensions = ("size_kb",)

    @classmethod
    def tiny(cls, workdir: str) -> "JpegIncompressibility":
        """The real reward (no model)."""
        return cls()
