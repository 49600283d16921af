"""A batch-relative composite as the NFT trainer's reward: scored per decoded batch as axis scores, combined
once over the whole epoch (so the z-scores do not depend on the sampling batch size), group normalisation by
prompt index, NaN per sample, and a tiny end-to-end run from a YAML-style config with ``tiny:`` paths nested
in the axes' options."""

from __future__ import annotations

import math

import pytest
import torch

from rewardkit.compose.composite import Composite
from rewardkit.reward import Reward, RewardBatch, RewardOutput
from tests.helpers.nft_runs import tiny_cfg

NAN = float("nan")


class MeanRed(Reward):
    """Score = mean of the red channel (hand-computable); a sample whose green channel is all 1 has no score."""

    name = "test-mean-red"

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale

    def _score(self, batch: RewardBatch) -> RewardOutput:
        vals, errs = [], []
        for img in batch.images:
            t = torch.tensor(__import__("numpy").array(img), dtype=torch.float64) / 255.0
            if bool((t[..., 1] == 1.0).all()):
                vals.append(NAN)
                errs.append("green image")
            else:
                vals.append(float(t[..., 0].mean()) * self.scale)
                errs.append(None)
        return RewardOutput(scores=torch.tensor(vals, dtype=torch.float32), errors=errs)


def scorer_with(reward, weight=1.0, key="comp"):
    from rewardkit.rl.trainer import _batch_relative, _RewardScorer

    sc = object.__new__(_RewardScorer)
    sc.names, sc.weights, sc.rewards, sc.keys = [key], [weight], [reward], [key]
    sc.deferred = {key} if _batch_relative(reward) else set()
    return sc


def images(reds, green=None):
    """float ``[B, 3, 4, 4]`` with constant red channels ``reds`` (green 1 where ``green`` lists the index)."""
    x = torch.zeros(len(reds), 3, 4, 4)
    for i, r in enumerate(reds):
        x[i, 0] = r
        if green is not None and i in green:
            x[i, 1] = 1.0
    return x


def zs(vals, eps=1e-4):
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))
    return [(v - m) / (sd + eps) for v in vals]


def test_batch_composite_is_combined_over_the_whole_epoch():
    """Two decoded batches of 3: each axis is z-scored over all 6 samples (per-batch z-scores would differ)."""
    comp = Composite(axes=[{"name": "a"}, {"name": "b", "weight": 0.5}],
                     rewards={"a": MeanRed(1.0), "b": MeanRed(-2.0)})
    sc = scorer_with(comp, weight=2.0)
    reds = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    q = [round(r * 255) / 255 for r in reds]        # the images are quantised to uint8 on the way in
    res = [sc(images(reds[:3]), ["p"] * 3), sc(images(reds[3:]), ["p"] * 3)]
    assert all(math.isnan(float(v)) for r in res for v in r["total"])   # nothing final before finalize
    fin = sc.finalize(res, torch.tensor([0, 0, 0, 1, 1, 1]))
    za, zb = zs(q), zs([-2 * v for v in q])
    expect = [2.0 * (x + 0.5 * y) for x, y in zip(za, zb)]
    assert torch.allclose(fin["total"], torch.tensor(expect, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(fin["components"]["comp"], torch.tensor(expect, dtype=torch.float64) / 2, atol=1e-5)
    assert torch.allclose(fin["dimensions"]["comp.a/raw"], torch.tensor(q, dtype=torch.float64), atol=1e-6)
    # per-batch z-scoring (the old behaviour) gives a different answer on the same inputs
    per_batch = zs(q[:3]) + zs(q[3:])
    assert max(abs(a - b) for a, b in zip(per_batch, za)) > 0.3


def test_group_composite_groups_by_prompt_index_and_invalid_sample_is_nan():
    comp = Composite(axes=[{"name": "a"}], rewards={"a": MeanRed()}, normalize="group")
    sc = scorer_with(comp)
    reds = [0.0, 0.4, 0.2, 1.0, 0.6, 0.8]
    q = [round(r * 255) / 255 for r in reds]
    # identical prompt texts, two prompt indices: groups follow the indices, not the strings
    res = [sc(images(reds[:3], green={2}), ["same"] * 3), sc(images(reds[3:]), ["same"] * 3)]
    ids = torch.tensor([0, 1, 0, 1, 0, 1])
    fin = sc.finalize(res, ids)
    total = fin["total"]
    assert math.isnan(float(total[2])) and "green image" in fin["errors"][2]
    g0 = zs([q[0], q[4]])                 # group 0 without the invalid sample 2
    g1 = zs([q[1], q[3], q[5]])
    expect = [g0[0], g1[0], NAN, g1[1], g0[1], g1[2]]
    assert torch.allclose(total, torch.tensor(expect, dtype=torch.float64), atol=1e-5, equal_nan=True)
    with pytest.raises(ValueError, match="prompt ids"):
        sc.finalize(res, ids[:5])


def test_group_composite_groups_by_a_prompt_row_metadata_field_over_the_epoch():
    """`group_by: tag` with the prompt rows' metadata (now passed by the trainer): groups follow the field, across
    decoded batches (and prompt indices), not the prompt index."""
    comp = Composite(axes=[{"name": "a"}], rewards={"a": MeanRed()}, normalize="group", group_by="tag")
    sc = scorer_with(comp)
    reds = [0.0, 0.4, 0.2, 1.0, 0.6, 0.8]
    q = [round(r * 255) / 255 for r in reds]
    tags = ["x", "y", "x", "y", "y", "x"]
    meta = [{"tag": t} for t in tags]
    res = [sc(images(reds[:3]), ["p"] * 3, meta[:3]), sc(images(reds[3:]), ["p"] * 3, meta[3:])]
    fin = sc.finalize(res, torch.tensor([0, 1, 2, 3, 4, 5]))  # every sample its own prompt: ignored here
    gx, gy = zs([q[0], q[2], q[5]]), zs([q[1], q[3], q[4]])
    expect = [gx[0], gy[0], gx[1], gy[1], gy[2], gx[2]]
    assert torch.allclose(fin["total"], torch.tensor(expect, dtype=torch.float64), atol=1e-5)


def test_per_sample_rewards_are_not_deferred():
    comp = Composite(axes=[{"name": "a"}], rewards={"a": MeanRed()}, normalize="none")
    sc = scorer_with(comp)
    assert not sc.deferred
    r = sc(images([0.2, 0.6]), ["x", "y"])
    assert torch.allclose(r["total"], torch.tensor([51 / 255, 153 / 255], dtype=torch.float64), atol=1e-6)
    fin = sc.finalize([r], torch.tensor([0, 1]))
    assert torch.equal(fin["total"], r["total"])


@pytest.mark.slow
def test_nft_run_with_a_yaml_composite_reward(tmp_path, tiny_dirs):
    """One epoch with ``rewards: {composite: 1}`` whose axes name ``tiny:clip`` checkpoints in their options:
    the composite and its per-axis dimensions are logged, z-scored over the epoch (mean 0 by construction)."""
    from rewardkit.rl.trainer import NFTTrainer

    cfg = tiny_cfg(tmp_path / "run", tiny_dirs, num_epochs=1, save_every=0, eval_every=1,
                   rewards={"composite": 1.0},
                   reward_kwargs={"composite": {"axes": [
                       {"name": "pref", "reward": "pickscore", "options": {"model": "tiny:clip", "device": "cpu"}},
                       {"name": "align", "reward": "clipscore", "weight": 0.5,
                        "options": {"model": "tiny:clip", "device": "cpu"}}]}})
    cfg.rewards = {"composite": 1.0}                    # not merged with the base config's pickscore
    cfg.reward_kwargs = {"composite": cfg.reward_kwargs["composite"]}
    tr = NFTTrainer(cfg)
    assert tr.scorer.deferred == {"composite"}
    rec = tr.run_epoch()
    assert rec["invalid_rewards"] == 0
    assert abs(rec["reward/total/mean"]) < 1e-5                       # sum of epoch z-scores
    assert rec["reward/composite.pref/z/std"] == pytest.approx(1.0, abs=1e-2)
    assert math.isfinite(rec["reward/composite.pref/raw/mean"])
    assert "reward/composite.align/z/mean" in rec and "reward/composite.align/raw/std" in rec
    # evaluation: the z-scored total is meaningless (mean 0, groups of one): the axes' raw scores are logged
    ev = tr.evaluate()
    assert "eval/reward/total/mean" not in ev and "eval/reward/composite/mean" not in ev
    assert not any(k.endswith("/z/mean") for k in ev)
    assert math.isfinite(ev["eval/reward/composite.pref/raw/mean"])
    # curves: the raw axis series are drawn, the z-scores are not
    import json

    from rewardkit.rl import curves

    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"epoch": 1, **{k: v for k, v in rec.items() if isinstance(v, (int, float))}}) + "\n")
    drawn = []
    real = curves._series
    curves._series = lambda recs, key: (drawn.append(key), real(recs, key))[1]
    try:
        curves.plot_curves(m, tmp_path / "c.png")
    finally:
        curves._series = real
    assert "reward/composite.pref/raw/mean" in drawn and "reward/composite.pref/z/mean" not in drawn


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
