"""Adversarial review of the differentiable zoo rewards, the preference trainer's fp16 / head_lr changes and the
NFT trainer's batch-relative composite reward: each test here failed on the code before its fix.

Expected values are computed independently (by hand, or from the unclipped gradients of a reference run).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

NAN = float("nan")


# ---------------------------------------------------------------------------------------------- RL: composites
def _scorer(tmp_path, clip_dir, composite_kwargs: dict):
    """The NFT trainer's reward scorer built from a config, as `rewardkit rl nft` builds it."""
    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.trainer import _RewardScorer

    cfg = build_config(NFTConfig, {"output_dir": str(tmp_path), "rewards": {"composite": 1.0},
                                   "reward_kwargs": {"composite": composite_kwargs}})
    return _RewardScorer(cfg, tmp_path, None)


def _axis(name: str, clip_dir, reward: str = "clipscore", **extra) -> dict:
    return {"name": name, "reward": reward, "options": {"model": str(clip_dir), "device": "cpu"}, **extra}


def test_rl_group_composite_by_metadata_key_is_refused(tmp_path, tiny_clip_dir):
    """The trainer passes no metadata: `group_by: <key>` put every sample in one group ("None") and silently
    z-scored over the whole epoch instead of per group. Refused; `group_by: prompt` is accepted."""
    with pytest.raises(ValueError, match="group_by='seed'"):
        _scorer(tmp_path, tiny_clip_dir, {"axes": [_axis("a", tiny_clip_dir)], "normalize": "group",
                                          "group_by": "seed"})
    sc = _scorer(tmp_path, tiny_clip_dir, {"axes": [_axis("a", tiny_clip_dir)], "normalize": "group"})
    assert sc.deferred == {"composite"}


def test_rl_nested_batch_relative_composite_is_refused(tmp_path, tiny_clip_dir):
    """An axis that is itself a batch-normalised composite is called once per decoded batch by the outer one:
    its z-scores would depend on sample.batch_size, contrary to docs/rl.md. Refused."""
    inner = {"axes": [_axis("x", tiny_clip_dir), _axis("y", tiny_clip_dir, "pickscore")], "normalize": "batch"}
    with pytest.raises(ValueError, match="axis 'inner' normalises over each call"):
        _scorer(tmp_path, tiny_clip_dir, {"axes": [{"name": "inner", "reward": "composite", "options": inner}],
                                          "normalize": "none"})


def test_rl_served_batch_relative_reward_is_refused():
    """A reward whose `batch_relative` is True but that is not a local Composite (a served composite through
    `remote`) was scored per decoded batch, silently. Refused."""
    from rewardkit.reward import Reward, RewardBatch, RewardOutput
    from rewardkit.rl.trainer import _check_batch_relative

    class Served(Reward):
        name = "served"

        def __init__(self):
            super().__init__()
            self.batch_relative = True

        def _score(self, batch: RewardBatch) -> RewardOutput:  # pragma: no cover - never called
            raise AssertionError

    with pytest.raises(ValueError, match="normalises over each call"):
        _check_batch_relative("remote", Served())
