"""Fixtures shared by the RL tests: the tiny SD3 pipeline and CLIP checkpoints the trainer runs on."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from rewardkit.testing import save_tiny_checkpoint

    root = tmp_path_factory.mktemp("rl_tiny")
    return {"sd3": str(save_tiny_checkpoint("sd3", root / "sd3")), "clip": str(save_tiny_checkpoint("clip", root / "clip"))}
