"""``RemoteReward``, the client of ``rewardkit serve``: re-exported from :mod:`rewardkit.serve.client`, where it
lives, so that ``from rewardkit.client import RemoteReward`` keeps working."""

from __future__ import annotations

from .serve.client import (  # noqa: F401 - re-exported: rewardkit.client is the public path
    RemoteReward,
    RemoteRewardConfig,
    RemoteRewardError,
    encode_image,
    image_bytes,
    parse_urls,
)

__all__ = ["RemoteReward", "RemoteRewardConfig", "RemoteRewardError"]
