"""Session-wide fixtures: heavy imports and tiny checkpoints are built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
EDIT_EXAMPLE = SHARED / "fixtures" / "edit_example"


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_clip_dir(tiny_root) -> Path:
    from rewardkit.testing import save_tiny_checkpoint

    return save_tiny_checkpoint("clip", tiny_root / "clip")


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl_dir(tiny_root) -> Path:
    from rewardkit.testing import save_tiny_checkpoint

    return save_tiny_checkpoint("qwen2_5_vl", tiny_root / "qwen2_5_vl")


@pytest.fixture(scope="session")
def tiny_qwen3_vl_dir(tiny_root) -> Path:
    from rewardkit.testing import save_tiny_checkpoint

    return save_tiny_checkpoint("qwen3_vl", tiny_root / "qwen3_vl")


@pytest.fixture(scope="session")
def edit_example() -> Path:
    if not EDIT_EXAMPLE.is_dir():
        pytest.skip("../shared/fixtures/edit_example is not present")
    return EDIT_EXAMPLE
