"""JPEG (in)compressibility, DDPO's file-size rewards: importable from here as before. Each reward has its own
module: :mod:`rewardkit.rewards.jpeg_incompressibility` (``+size_kB``; the size rule, its sources and the
config) and :mod:`rewardkit.rewards.jpeg_compressibility` (``-size_kB / divisor``)."""

from __future__ import annotations

from .jpeg_compressibility import JpegCompressibility
from .jpeg_incompressibility import JpegConfig, JpegIncompressibility, jpeg_size_kb  # noqa: F401 - JpegConfig as before

__all__ = ["JpegCompressibility", "JpegIncompressibility", "jpeg_size_kb"]
