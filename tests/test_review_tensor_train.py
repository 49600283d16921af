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


def test_rl_group_composite_by_metadata_key_needs_the_key_in_every_prompt_row(tmp_path, tiny_clip_dir):
    """The trainer used to pass no metadata: `group_by: <key>` put every sample in one group ("None"). Prompt
    rows now carry metadata; a row without the key is refused at start; `group_by: prompt` is accepted."""
    from rewardkit.rl.scoring import check_group_keys

    sc = _scorer(tmp_path, tiny_clip_dir, {"axes": [_axis("a", tiny_clip_dir)], "normalize": "group",
                                           "group_by": "seed"})
    assert sc.deferred == {"composite"}
    check_group_keys(sc, [{"seed": 1}, {"seed": 2}], "p.jsonl")
    with pytest.raises(ValueError, match="metadata field 'seed'.*row 2"):
        check_group_keys(sc, [{"seed": 1}, {}], "p.jsonl")
    sc = _scorer(tmp_path, tiny_clip_dir, {"axes": [_axis("a", tiny_clip_dir)], "normalize": "group"})
    assert sc.deferred == {"composite"}
    check_group_keys(sc, [{}, {}], "p.jsonl")


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


# ---------------------------------------------------------------------------------------------- preference trainer
def _pref():
    import test_documented_options_train_rl as d  # tiny-run helpers (recipes/arena_rm/tiny.yaml, step recorder)

    return d


def _is_head(name: str) -> bool:
    return name.startswith("head.")


def test_resume_follows_the_configured_head_lr_not_the_checkpoints(tmp_path):
    """load_checkpoint restored each param group's `lr_scale` (and weight decay, betas, eps) from the checkpoint,
    and the trainer sets lr = schedule * lr_scale every step: a checkpoint written before `head_lr: 0` meant
    "freeze" (the old code stored scale 1 for it), or any run resumed with a new head_lr, kept training the head
    at the old rate. Resumed with head_lr=0, the head must not move; the body follows optim.lr."""
    d = _pref()
    lr = 1e-3
    out = tmp_path / "run"
    first = d.run_recording(d.tiny_cfg(out, "max_steps=1", f"optim.lr={lr}", "optim.head_lr=0.05",
                                       "optim.max_grad_norm=null"))
    assert first["steps"][0]["lrs"] == [lr, 0.05]
    after_first = {n: p.detach().clone() for n, p in first["trainer"].model_raw.named_parameters()}
    second = d.run_recording(d.tiny_cfg(out, "max_steps=2", f"optim.lr={lr}", "optim.head_lr=0",
                                        "optim.max_grad_norm=null", "optim.weight_decay=0.25"))
    tr = second["trainer"]
    assert [r for r in second["metrics"] if r["split"] == "info"][-1]["resumed_from"]
    assert len(second["steps"]) == 1 and second["steps"][0]["lrs"] == [lr, 0.0]
    assert [g["weight_decay"] for g in d._inner(tr.opt).param_groups] == [0.25, 0.25]
    now = dict(tr.model_raw.named_parameters())
    head = [n for n in now if _is_head(n)]
    assert head and all(torch.equal(now[n].detach(), after_first[n]) for n in head)
    body_move = max((now[n].detach() - after_first[n]).abs().max().item()
                    for n, p in now.items() if p.requires_grad and not _is_head(n))
    assert body_move > 0.5 * lr  # Adam's step ~ lr (plus decoupled decay lr * 0.25 * |w|)


def test_frozen_head_does_not_take_part_in_gradient_clipping(tmp_path):
    """With head_lr=0 the head is frozen, but its gradients were part of the clipped total norm, so they scaled
    the body's update (and the logged grad_norm). Expected: the body's gradients clipped by the body's own norm,
    computed here from an unclipped run on the same data."""
    d = _pref()
    ref = d.run_recording(d.tiny_cfg(tmp_path / "ref", "max_steps=1", "optim.head_lr=0", "optim.max_grad_norm=null"))
    grads = ref["steps"][0]["grads"]
    norm = lambda gs: math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs))  # noqa: E731
    body = {n: g for n, g in grads.items() if not _is_head(n)}
    b_norm, all_norm = norm(body.values()), norm(grads.values())
    max_norm = 0.5 * b_norm
    right, wrong = max_norm / (b_norm + 1e-6), max_norm / (all_norm + 1e-6)
    assert abs(right - wrong) > 4e-4 * right  # the head's gradient is large enough to tell them apart (vs rtol 1e-4)
    run = d.run_recording(d.tiny_cfg(tmp_path / "clip", "max_steps=1", "optim.head_lr=0",
                                     f"optim.max_grad_norm={max_norm!r}"))
    got = run["steps"][0]["grads"]
    for n, g in body.items():
        torch.testing.assert_close(got[n], g * right, rtol=1e-4, atol=1e-9)
    logged = [r["grad_norm"] for r in run["metrics"] if r["split"] == "train"]
    assert logged == [pytest.approx(b_norm, rel=1e-5)]


# ---------------------------------------------------------------------------------------------- differentiable zoo
@pytest.fixture(scope="module")
def hpsv2_tiny(tmp_path_factory):
    from rewardkit.rewards.hpsv2 import HPSv2

    return HPSv2.tiny(str(tmp_path_factory.mktemp("hpsv2")))


def test_hpsv2_score_tensor_refuses_a_side_that_rounds_to_zero_as_input_error(hpsv2_tiny):
    """The tiny HPSv2 works at 32 px: a 1 x 70 image resizes to round(32 / 70) = 0 rows (aspect ratio 70, under the
    default bound of 200). The ordinary call makes it that sample's error; score_tensor raised a bare ValueError
    from inside the pre-processing instead of the RewardInputError naming the sample that it documents."""
    from rewardkit.errors import RewardInputError

    x = torch.full((2, 3, 1, 70), 0.5)
    out = hpsv2_tiny(x, "a cat", on_error="nan")
    assert not bool(out.valid[0]) and "0 pixels" in out.errors[0]
    with pytest.raises(RewardInputError, match="0 pixels") as exc:
        hpsv2_tiny.score_tensor(x.requires_grad_(True), "a cat")
    assert exc.value.index == 0
    ok = torch.full((1, 3, 2, 70), 0.5, requires_grad=True)  # round(64 / 70) = 1 row: accepted
    hpsv2_tiny.score_tensor(ok, "a cat").sum().backward()
    assert ok.grad is not None and torch.isfinite(ok.grad).all()


@pytest.mark.parametrize("bad", ["optim.lr=inf", "optim.lr=1e400", "optim.head_lr=inf", "optim.max_grad_norm=-1",
                                 "optim.max_grad_norm=nan"])
def test_non_finite_lr_and_bad_max_grad_norm_are_refused(tmp_path, bad):
    """An infinite lr turned the first Adam step into inf / NaN weights; a negative max_grad_norm made torch scale
    every gradient by max_norm / norm < 0, i.e. gradient ascent, silently; NaN made every gradient NaN."""
    from rewardkit.train.trainer import _validate

    with pytest.raises(ValueError, match="lr|max_grad_norm"):
        _validate(_pref().tiny_cfg(tmp_path, bad))
    for ok in ("optim.max_grad_norm=0", "optim.max_grad_norm=null", "optim.max_grad_norm=inf", "optim.head_lr=0"):
        _validate(_pref().tiny_cfg(tmp_path, ok))
