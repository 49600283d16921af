"""Checkpoint publishing and rotation (``save_total_limit``), shared by the preference and NFT trainers: one rename
publishes a finished ``*.tmp`` folder, ``latest`` names it, and only the newest ``keep`` checkpoints stay. The
expected survivors are written out by hand from the trainers' naming rules, not derived from the code."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewardkit.train.checkpoint import latest_checkpoint, publish_checkpoint


def _publish(root: Path, name: str, pattern: str, keep: int) -> None:
    tmp = root / f"{name}.tmp"
    tmp.mkdir(parents=True)
    (tmp / "state.json").write_text("{}", encoding="utf-8")
    publish_checkpoint(root, tmp, root / name, pattern, keep)


def _kept(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def test_preference_steps_keep_the_newest_two_and_latest_points_at_the_last(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (5, 10, 95, 100, 105):  # 100 > 95 numerically; the 8-digit names keep that order as text
        _publish(root, f"step-{step:08d}", "step-*", keep=2)
    assert _kept(root) == ["step-00000100", "step-00000105"]
    assert latest_checkpoint(tmp_path) == root / "step-00000105"


def test_nft_mid_epoch_checkpoints_rotate_in_the_order_they_were_written(tmp_path):
    """``epoch-N`` is written after epoch N, ``epoch-N-step-S`` inside epoch N + 1 (rl/checkpoints.py): written in
    that order, the newest two are the last mid-epoch save and the end of the next epoch. A rotation that sorted
    the end-of-epoch save after its own epoch's steps (or by length) would delete ``epoch-000004``."""
    root = tmp_path / "checkpoints"
    order = ["epoch-000003", "epoch-000003-step-00000031", "epoch-000003-step-00000032", "epoch-000004"]
    for name in order:
        _publish(root, name, "epoch-*", keep=2)
    assert _kept(root) == ["epoch-000003-step-00000032", "epoch-000004"]
    assert latest_checkpoint(tmp_path) == root / "epoch-000004"


@pytest.mark.parametrize("keep", [0, 1])
def test_at_least_one_checkpoint_always_stays(tmp_path, keep):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _publish(root, f"step-{step:08d}", "step-*", keep=keep)
    assert _kept(root) == ["step-00000003"]
    assert latest_checkpoint(tmp_path) == root / "step-00000003"


def test_leftover_tmp_folders_neither_count_nor_get_deleted_by_rotation(tmp_path):
    """A ``*.tmp`` left by a killed save is the trainer's to clean (before its next save), not rotation's: it must
    not push a real checkpoint out of the kept set."""
    root = tmp_path / "checkpoints"
    _publish(root, "step-00000001", "step-*", keep=2)
    (root / "step-00000009.tmp").mkdir()
    _publish(root, "step-00000002", "step-*", keep=2)
    assert _kept(root) == ["step-00000001", "step-00000002", "step-00000009.tmp"]


def test_republishing_a_name_replaces_it(tmp_path):
    root = tmp_path / "checkpoints"
    _publish(root, "step-00000001", "step-*", keep=2)
    (root / "step-00000001" / "stale.bin").write_bytes(b"old")
    _publish(root, "step-00000001", "step-*", keep=2)
    assert not (root / "step-00000001" / "stale.bin").exists()
    assert (root / "step-00000001" / "state.json").is_file()
