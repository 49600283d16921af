"""Composites as RL rewards: axis_scores + combine (== one call), statistics over fully valid samples only,
the RL z-score convention, and gather + combine across 2 gloo processes."""

from __future__ import annotations

import math
import os
import textwrap

import pytest
import torch
from PIL import Image

from rewardkit.compose.composite import AxisScores, Composite
from rewardkit.compose.functions import group_zscore, zscore
from rewardkit.errors import ConfigError
from rewardkit.reward import Reward, RewardBatch, RewardOutput

NAN = float("nan")


class MetaScore(Reward):
    """Scores ``metadata[i][key]`` (None -> NaN + reason): hand-computable axis values."""

    name = "test-meta-score"

    def __init__(self, key: str):
        super().__init__()
        self.key = key

    def _score(self, batch: RewardBatch) -> RewardOutput:
        vals = [m.get(self.key) for m in batch.metadata]
        return RewardOutput(scores=torch.tensor([NAN if v is None else float(v) for v in vals]),
                            errors=[f"no {self.key}" if v is None else None for v in vals])


def comp(**kw):
    axes = kw.pop("axes", [{"name": "pref"}, {"name": "faith", "weight": 2.0}])
    rewards = kw.pop("rewards", None) or {"pref": MetaScore("p"), "faith": MetaScore("f"),
                                          "constr": MetaScore("c"), "detectors": MetaScore("d")}
    return Composite(axes=axes, rewards={k: v for k, v in rewards.items()
                                         if k in {a["name"] for a in axes} | ({"detectors"} if kw.get("detectors") else set())},
                     **kw)


IMGS = [Image.new("RGB", (8, 8), (i * 30, 0, 0)) for i in range(6)]


def close(a, b, tol=1e-6):
    return bool(torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=tol, equal_nan=True))


# ---------------------------------------------------------------- issue 9 item 13
def test_statistics_only_over_samples_valid_on_every_enabled_axis():
    """An outlier whose faithfulness is NaN must not move anyone's preference z (failed before: the preference
    statistics included it)."""
    p = [1.0, 2.0, 3.0, 100.0]
    f = [0.5, 0.1, 0.9, None]                      # sample 3: faithfulness NaN, preference an outlier
    c = comp()
    out = c(IMGS[:4], "x", metadata=[{"p": a, "f": b} for a, b in zip(p, f)])
    assert not out.valid[3] and "axis 'faith': no f" in out.errors[3]
    zp = zscore(torch.tensor(p[:3]), mode="rl")
    zf = zscore(torch.tensor(f[:3]), mode="rl")
    assert close(out.dimensions["pref/z"][:3], zp) and math.isnan(out.dimensions["pref/z"][3])
    assert close(out.scores[:3], zp + 2.0 * zf)
    # the other samples' scores equal a call without the invalid sample
    alone = c(IMGS[:3], "x", metadata=[{"p": a, "f": b} for a, b in zip(p[:3], f[:3])])
    assert close(out.scores[:3], alone.scores)


def test_gated_off_axis_does_not_exclude_a_sample():
    """Only *enabled* axes count: a gated-off axis that could not score does not invalidate the sample."""
    c = comp(axes=[{"name": "pref"}, {"name": "constr", "gate": "intent"}])
    meta = [{"p": 1.0, "c": 0.2, "intent": "strict"}, {"p": 2.0, "c": None, "intent": "open"},
            {"p": 4.0, "c": 0.6, "intent": "strict"}]
    out = c(IMGS[:3], "x", metadata=meta)
    assert out.valid.all()
    assert close(out.dimensions["pref/z"], zscore(torch.tensor([1.0, 2.0, 4.0]), mode="rl"))


def test_near_zero_variance_rl_convention_is_default():
    """Scores that differ by float noise: the cut-off convention turned them into z = +-1 (failed before);
    the RL convention (x - mean) / (std + 1e-4) keeps them near 0."""
    p = [0.5, 0.5 + 4e-6]                          # population std 2e-6: above the old cut-off 1e-6
    meta = [{"p": v} for v in p]
    c = comp(axes=[{"name": "pref"}])
    out = c(IMGS[:2], "x", metadata=meta)
    assert c.config.zscore == "rl" and out.info["zscore"] == {"mode": "rl", "eps": 1e-4}
    x = torch.tensor(p, dtype=torch.float32)      # the reward's float32 scores
    std = float(x[1].double() - x[0].double()) / 2
    expect = torch.tensor([-std / (std + 1e-4), std / (std + 1e-4)])
    assert close(out.scores, expect, tol=1e-5) and out.scores.abs().max() < 0.05
    cut = comp(axes=[{"name": "pref"}], zscore="cutoff")(IMGS[:2], "x", metadata=meta)
    assert close(cut.scores, [-1.0, 1.0], tol=1e-3)            # the documented alternative
    zero = c(IMGS[:3], "x", metadata=[{"p": 0.7}] * 3)
    assert close(zero.scores, [0.0, 0.0, 0.0])                  # zero variance -> 0, never NaN
    with pytest.raises(ConfigError, match="zscore must be one of"):
        comp(zscore="minmax")
    with pytest.raises(ConfigError, match="eps"):
        comp(eps=0.0)


def test_zscore_rl_mode_hand_computed():
    x = torch.tensor([1.0, 2.0, 3.0])
    s = math.sqrt(2 / 3)
    assert close(zscore(x, mode="rl"), [-1 / (s + 1e-4), 0.0, 1 / (s + 1e-4)])
    assert close(zscore(x, mode="rl", eps=0.5), [-1 / (s + 0.5), 0.0, 1 / (s + 0.5)])
    assert close(group_zscore(torch.tensor([1.0, 3.0, 5.0]), ["a", "a", "b"], mode="rl"),
                 [-1 / (1 + 1e-4), 1 / (1 + 1e-4), 0.0])
    with pytest.raises(ValueError, match="mode"):
        zscore(x, mode="std")


# ---------------------------------------------------------------- axis_scores + combine
META = [{"p": 0.1, "f": 0.3, "c": 0.2, "d": 0, "intent": "strict"},
        {"p": 0.9, "f": 0.1, "c": 0.5, "d": 1, "intent": "open"},
        {"p": 0.4, "f": None, "c": 0.9, "d": 0, "intent": "strict"},
        {"p": 0.7, "f": 0.8, "c": 0.1, "d": 1, "intent": "strict"},
        {"p": 0.2, "f": 0.6, "c": None, "d": 0, "intent": "neutral"},
        {"p": 0.5, "f": 0.4, "c": 0.7, "d": 0, "intent": "strict"}]
PROMPTS = ["a", "a", "b", "b", "c", "c"]


def full_comp(normalize="batch"):
    return comp(axes=[{"name": "pref"}, {"name": "faith"}, {"name": "constr", "gate": "intent"}],
                detectors={"mode": "veto", "target": "pref"}, normalize=normalize)


@pytest.mark.parametrize("normalize", ["batch", "group", "none"])
def test_axis_scores_then_combine_equals_one_call(normalize):
    c = full_comp(normalize)
    whole = c(IMGS, PROMPTS, metadata=META)
    parts = [c.axis_scores(IMGS[a:b], PROMPTS[a:b], metadata=META[a:b]) for a, b in ((0, 4), (4, 6))]
    joined = c.combine(AxisScores.cat(parts))
    assert close(joined.scores, whole.scores) and joined.errors == whole.errors
    assert joined.valid.tolist() == whole.valid.tolist()
    assert set(joined.dimensions) == set(whole.dimensions)
    for k in whole.dimensions:
        assert close(joined.dimensions[k], whole.dimensions[k]), k
    # per-slice calls are NOT the same for batch normalisation (what gather + combine fixes)
    if normalize == "batch":
        sliced = torch.cat([c(IMGS[a:b], PROMPTS[a:b], metadata=META[a:b]).scores for a, b in ((0, 4), (4, 6))])
        assert not close(sliced, whole.scores)


def test_axis_scores_roundtrip_payload_and_group_keys_override():
    c = full_comp("group")
    ax = c.axis_scores(IMGS, PROMPTS, metadata=META)
    back = AxisScores.from_payload(ax.to_payload())
    assert close(c.combine(back).scores, c.combine(ax).scores)
    by_id = c.combine(ax, group_keys=[0, 0, 0, 1, 1, 1])
    assert close(by_id.dimensions["pref/z"][:3], group_zscore(torch.tensor([0.1, 0.9, 0.4]), [0, 0, 0],
                                                              torch.tensor([True, True, False]), mode="rl"))
    with pytest.raises(ValueError, match="group keys"):
        c.combine(ax, group_keys=[0, 1])
    with pytest.raises(TypeError, match="AxisScores"):
        c.combine({"raw": {}})


def test_axis_scores_bad_input_is_an_invalid_sample():
    c = full_comp()
    imgs = list(IMGS)
    imgs[1] = "/nonexistent/image.png"
    ax = c.axis_scores(imgs, PROMPTS, metadata=META)
    assert ax.input_errors[1] and ax.input_errors[0] is None
    out = c.combine(ax)
    whole = c(imgs, PROMPTS, metadata=META, on_error="nan")
    assert close(out.scores, whole.scores) and not out.valid[1] and out.errors[1] == whole.errors[1]


# ---------------------------------------------------------------- 2 gloo processes
WORKER = textwrap.dedent('''
    import json, os, sys
    import torch
    from PIL import Image
    sys.path.insert(0, os.environ["TEST_DIR"])
    from test_composite_rl import full_comp, META, PROMPTS, IMGS
    from rewardkit import distributed

    assert distributed.init_from_env("gloo")
    r, w = distributed.rank(), distributed.world_size()
    idx = distributed.shard_indices(len(IMGS))
    got = {}
    for normalize in ("batch", "group"):  # one process group for both (a start-up costs more than the checks)
        c = full_comp(normalize)
        ax = c.axis_scores([IMGS[i] for i in idx], [PROMPTS[i] for i in idx], metadata=[META[i] for i in idx])
        full = distributed.gather_combine(c, ax)
        local = distributed.gather_combine(c, ax, local=True)
        got[normalize] = {"full": full.scores.tolist(), "errors": full.errors, "local": local.scores.tolist(),
                          "idx": idx, "world": w}
    if r == 0:
        json.dump(got, open(os.environ["OUT"], "w"))
    torch.distributed.destroy_process_group()
''')


@pytest.mark.slow
@pytest.mark.distributed
def test_gather_combine_two_gloo_processes_equals_one_call(tmp_path):
    """Both normalisations that need the whole batch ("batch", "group") in one launch of 2 gloo processes (started
    directly, no torchrun agent: tests/helpers/gloo.py)."""
    import json

    from tests.helpers.gloo import run_two_gloo_workers

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out.json"
    run_two_gloo_workers(script, dict(os.environ, TEST_DIR=os.path.dirname(__file__), OUT=str(out),
                                      OMP_NUM_THREADS="1"))
    results = json.loads(out.read_text())
    assert sorted(results) == ["batch", "group"]
    for normalize, got in results.items():
        assert got["world"] == 2 and got["idx"] == [0, 1, 2]
        c = full_comp(normalize)
        whole = c(IMGS, PROMPTS, metadata=META)
        expect = [NAN if v is None else v for v in whole.scores.tolist()]
        full = torch.tensor([NAN if v is None else v for v in got["full"]])
        assert torch.allclose(full, torch.tensor(expect), atol=1e-6, equal_nan=True), normalize
        assert got["errors"] == whole.errors, normalize
        assert torch.allclose(torch.tensor(got["local"]), full[:3], atol=0, equal_nan=True), normalize
