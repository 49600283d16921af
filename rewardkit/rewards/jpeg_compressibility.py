"""JPEG compressibility: minus the file size of the image saved as JPEG, ``-size_kB / divisor`` (DDPO's
``jpeg_compressibility`` with divisor 1, ``rewards.py:26``; flow_grpo's and DiffusionNFT's with 500,
``rewards.py:27`` / ``:28``). The size rule, its sources and the config are those of
:mod:`rewardkit.rewards.jpeg_incompressibility`; only the sign differs.
"""

from __future__ import annotations

from typing import ClassVar

from .jpeg_incompressibility import JpegIncompressibility

__all__ = ["JpegCompressibility"]


class JpegCompressibility(JpegIncompressibility):
    """``-size_kB / divisor`` of the image saved as JPEG at quality 95 (DDPO: divisor 1; flow_grpo: 500)."""

    name: ClassVar[str] = "jpeg-compressibility"
    sign: ClassVar[float] = -1.0
