"""RL resume keys on the content of the checkpoints the run names (issue 36 item 3): ``state.json`` keeps
``content`` (:func:`rewardkit.rl.checkpoints.weights_content`) and ``load_checkpoint`` refuses a resume whose
base model or reward model was replaced at the same path; the same weights at another path are no change."""

from __future__ import annotations

import shutil


def test_weights_content_sees_new_weights_at_a_path_not_a_moved_copy(tmp_path, monkeypatch):
    """Bug: the resume check compared configuration strings only (and not even the model's), so a reward
    model retrained in place was silently mixed into a resumed run."""
    from rewardkit.fingerprint import content_changes
    from rewardkit.rl.checkpoints import weights_content
    from rewardkit.rl.config import NFTConfig

    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))
    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / "model.safetensors").write_bytes(b"A" * 128)
    cfg = NFTConfig()
    cfg.reward_kwargs = {"pickscore": {"model": str(rm)}}
    saved = weights_content(cfg)
    assert saved["reward_kwargs"]["pickscore"]["model"].startswith("content:")
    moved = tmp_path / "moved"
    shutil.copytree(rm, moved)
    cfg.reward_kwargs = {"pickscore": {"model": str(moved)}}
    assert content_changes(saved, weights_content(cfg)) == []
    (moved / "model.safetensors").write_bytes(b"B" * 128)
    assert content_changes(saved, weights_content(cfg)) == ["reward_kwargs.pickscore.model"]
    assert content_changes(None, weights_content(cfg)) == []  # a checkpoint from before: not checked
