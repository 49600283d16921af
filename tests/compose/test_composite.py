"""Composition math (hand-computed) and the Composite / WeightedSum rewards on pixel-statistic rewards."""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit.compose.composite import Composite, WeightedSum, build_composite
from rewardkit.compose.functions import additive_penalty, combine, group_zscore, intent_gate, veto, zscore
from rewardkit.errors import ConfigError
from rewardkit.reward import Reward, RewardBatch, RewardConfig, RewardOutput

NAN = float("nan")


def zr(x):
    """The composite default, written here in numpy (the expected side never calls compose.functions, which the
    composite itself uses): the RL convention (x - mean) / (population std + 1e-4)."""
    x = np.asarray(x, dtype=np.float64)
    return torch.from_numpy((x - x.mean()) / (x.std() + 1e-4)).float()


def gzr(x, keys):
    """:func:`zr` within each group of equal keys (a group of one gets 0)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for k in set(keys):
        idx = [i for i, kk in enumerate(keys) if kk == k]
        out[idx] = (x[idx] - x[idx].mean()) / (x[idx].std() + 1e-4)
    return torch.from_numpy(out).float()


def close(a, b, tol=1e-5):
    a = torch.as_tensor(a, dtype=torch.float32)
    b = torch.as_tensor(b, dtype=torch.float32)
    return bool(torch.allclose(a, b, atol=tol, equal_nan=True))


# ---------------------------------------------------------------- pure functions
def test_zscore_hand_computed():
    # mean 2, population std sqrt(2/3)
    z = zscore(torch.tensor([1.0, 2.0, 3.0]))
    s = math.sqrt(2 / 3)
    assert close(z, [-1 / s, 0.0, 1 / s])


def test_zscore_zero_variance_is_zero_not_nan():
    assert close(zscore(torch.tensor([0.7, 0.7, 0.7])), [0.0, 0.0, 0.0])
    assert close(zscore(torch.tensor([5.0])), [0.0])             # one sample: no spread
    assert torch.isfinite(zscore(torch.tensor([1.0, 1.0 + 1e-9]))).all()


def test_zscore_mask_and_nan_excluded():
    z = zscore(torch.tensor([1.0, NAN, 3.0, 100.0]), mask=torch.tensor([True, True, True, False]))
    assert close(z, [-1.0, NAN, 1.0, NAN])                         # stats over {1, 3}: mean 2, std 1
    assert torch.isnan(zscore(torch.tensor([NAN, NAN]))).all()


def test_group_zscore():
    x = torch.tensor([1.0, 3.0, 10.0, 10.0, 4.0])
    z = group_zscore(x, ["a", "a", "b", "b", "c"])
    assert close(z, [-1.0, 1.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        group_zscore(x, ["a"])


def test_intent_gate():
    assert close(intent_gate(["strict", "neutral", "open", None]), [1, 0, 0, 0])
    assert close(intent_gate(["strict", "neutral"], on=("strict", "neutral")), [1, 1])


def test_veto_positive_and_negative_z():
    z = torch.tensor([1.5, -0.5, 0.8, -2.0, 0.0])
    fired = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])
    # fired & positive -> 0; fired & negative -> unchanged; not fired -> unchanged
    assert close(veto(z, fired), [0.0, -0.5, 0.8, -2.0, 0.0])
    assert close(veto(z, fired, strength=0.5), [0.75, -0.5, 0.8, -2.0, 0.0])


def test_additive_penalty_differs_from_veto_on_negative_z():
    z = torch.tensor([1.5, -0.5])
    fired = torch.tensor([1.0, 1.0])
    assert close(additive_penalty(z, fired, penalty=1.0), [0.5, -1.5])


def test_combine_gated_nan_contributes_zero():
    zp = torch.tensor([1.0, -1.0, 0.5])
    zf = torch.tensor([0.5, 0.5, -1.0])
    zc = torch.tensor([2.0, NAN, NAN])          # constraint asked only for sample 0
    g = torch.tensor([1.0, 0.0, 0.0])
    r = combine([zp, zf, zc], [1.0, 1.0, 1.0], [None, None, g])
    assert close(r, [3.5, -0.5, -0.5])
    r2 = combine([zp, zf, zc], [2.0, 1.0, 0.5], [None, None, g])
    assert close(r2, [2.0 + 0.5 + 1.0, -2.0 + 0.5, 1.0 - 1.0])
    # an open gate over a NaN makes the sum NaN (the caller reports why)
    assert torch.isnan(combine([zc], [1.0], [torch.ones(3)]))[1]


# ---------------------------------------------------------------- pixel-statistic rewards for the composite
@dataclass
class _ChanConfig(RewardConfig):
    channel: int = 0
    nan_below: float = -1.0      # mean below this -> invalid (to exercise error propagation)


class ChannelMean(Reward):
    """Mean of one colour channel in [0, 1] (a real, deterministic per-image statistic)."""

    name = "test-channel-mean"
    thread_safe = True
    Config = _ChanConfig

    def _score(self, batch: RewardBatch) -> RewardOutput:
        vals = torch.tensor([float(np.asarray(im)[..., self.config.channel].mean()) / 255.0 for im in batch.images])
        bad = vals < self.config.nan_below
        return RewardOutput(scores=torch.where(bad, torch.full_like(vals, NAN), vals),
                            errors=["too dark" if b else None for b in bad.tolist()])


class BrightDetector(Reward):
    """Fires (1) when the image's green mean exceeds 0.5: stands in for a judge-based detector."""

    name = "test-bright-detector"
    higher_is_better = False

    def _score(self, batch: RewardBatch) -> RewardOutput:
        return RewardOutput(scores=torch.tensor([float(np.asarray(im)[..., 1].mean() / 255.0 > 0.5)
                                                 for im in batch.images]))


def solid(r, g, b, size=8):
    return Image.new("RGB", (size, size), (r, g, b))


IMGS = [solid(200, 10, 0), solid(100, 200, 0), solid(50, 10, 0), solid(150, 220, 255)]
RED = torch.tensor([200, 100, 50, 150]) / 255.0
BLUE = torch.tensor([0, 0, 0, 255]) / 255.0


def _composite(**kw):
    axes = kw.pop("axes", [{"name": "preference"}, {"name": "faithfulness"},
                           {"name": "constraint", "gate": "intent"}])
    rewards = {"preference": ChannelMean(channel=0), "faithfulness": ChannelMean(channel=2),
               "constraint": ChannelMean(channel=2), "detectors": BrightDetector()}
    return Composite(axes=axes, rewards=rewards, **kw)


META = [{"intent": "strict"}, {"intent": "neutral"}, {"intent": "open"}, {"intent": "strict"}]


def test_composite_matches_formula_by_hand():
    comp = _composite(detectors={"mode": "veto", "target": "preference"})
    out = comp(IMGS, "p", metadata=META)
    zp = zr(RED)
    zf = zr(BLUE)
    zc = zr(BLUE[[0, 3]])                    # constraint statistics over the strict samples only
    fired = torch.tensor([0.0, 1.0, 0.0, 1.0])   # green > 0.5 on images 1 and 3
    zp_v = zp - fired * zp.clamp(min=0)
    expect = zp_v + zf + torch.tensor([zc[0], 0.0, 0.0, zc[1]])
    assert close(out.scores, expect)
    assert out.valid.all()
    assert close(out.dimensions["preference/raw"], RED)
    assert close(out.dimensions["constraint/gate"], [1, 0, 0, 1])
    assert close(out.dimensions["constraint/z"], [zc[0], NAN, NAN, zc[1]])
    assert close(out.dimensions["detectors/fired"], fired)
    assert close(out.dimensions["preference/z_vetoed"], zp_v)
    # image 3 has positive z_pref and fired: its preference term is exactly 0; image 1 (fired) too
    assert float(zp[3]) > 0 and float(out.dimensions["preference/z_vetoed"][3]) == 0.0
    assert out.details[0] == {"intent": "strict"}


def test_composite_ablations_additive_and_ungated():
    fired = torch.tensor([0.0, 1.0, 0.0, 1.0])
    add = _composite(detectors={"mode": "additive", "penalty": 1.0})(IMGS, "p", metadata=META)
    zp, zf = zr(RED), zr(BLUE)
    zc = zr(BLUE[[0, 3]])
    assert close(add.scores, zp - fired + zf + torch.tensor([zc[0], 0, 0, zc[1]]))
    ungated = _composite(gating="none")(IMGS, "p", metadata=META)
    assert close(ungated.scores, zp + zf + zr(BLUE))
    assert close(ungated.dimensions["constraint/gate"], [1, 1, 1, 1])


def test_composite_missing_intent_gates_off_and_group_normalisation():
    comp = _composite(normalize="group")
    out = comp(IMGS, ["a", "a", "b", "b"], metadata=[{"intent": "strict"}, {}, {}, {"intent": "strict"}])
    zp = gzr(RED, ["a", "a", "b", "b"])
    zf = gzr(BLUE, ["a", "a", "b", "b"])
    # constraint: strict samples 0 (group a) and 3 (group b) are each alone in their group -> z = 0
    assert close(out.scores, zp + zf)


def test_composite_chunking_does_not_change_scores():
    comp = _composite(detectors={"mode": "veto"})
    whole = comp(IMGS, "p", metadata=META)
    for bs in (1, 3):
        assert close(comp(IMGS, "p", metadata=META, batch_size=bs).scores, whole.scores)


def test_composite_invalid_axis_makes_sample_invalid_with_reason():
    rewards = {"preference": ChannelMean(channel=0, nan_below=0.3), "faithfulness": ChannelMean(channel=2)}
    comp = Composite(axes=[{"name": "preference"}, {"name": "faithfulness"}], rewards=rewards)
    out = comp(IMGS, "p")
    assert not out.valid[2] and "axis 'preference': too dark" in out.errors[2]
    # statistics exclude the invalid sample
    assert close(out.dimensions["preference/z"][[0, 1, 3]], zr(RED[[0, 1, 3]]))
    assert torch.isnan(out.scores[2])


def test_weighted_sum_is_raw_and_per_sample():
    ws = WeightedSum(axes=[{"name": "r", "weight": 2.0}, {"name": "b", "weight": -0.5}],
                     rewards={"r": ChannelMean(channel=0), "b": ChannelMean(channel=2)})
    out = ws(IMGS, "p")
    assert close(out.scores, 2.0 * RED - 0.5 * BLUE)
    single = ws(IMGS[3:], "p")
    assert close(single.scores, out.scores[3:])
    assert pickle.loads(pickle.dumps(ws.config)) == ws.config


def test_fixed_normalisation_is_per_sample():
    comp = Composite(axes=[{"name": "r", "mean": 0.5, "std": 0.25}, {"name": "b", "mean": 0.0, "std": 2.0}],
                     rewards={"r": ChannelMean(channel=0), "b": ChannelMean(channel=2)}, normalize="fixed")
    out = comp(IMGS, "p")
    assert close(out.scores, (RED - 0.5) / 0.25 + BLUE / 2.0)
    assert close(comp(IMGS[1:2], "p").scores, out.scores[1:2])      # no dependence on the rest of the batch
    with pytest.raises(ConfigError, match="needs mean and std"):
        Composite(axes=[{"name": "r", "mean": 0.5}], rewards={"r": ChannelMean()}, normalize="fixed")


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="at least one axis"):
        Composite(axes=[])
    with pytest.raises(ConfigError, match="gate must be one of"):
        _composite(axes=[{"name": "preference", "gate": "sometimes"}])
    with pytest.raises(ConfigError, match="normalize"):
        _composite(normalize="minmax")
    with pytest.raises(ConfigError, match="no 'reward'"):
        Composite(axes=[{"name": "x"}])
    with pytest.raises(ConfigError, match="unknown axis key"):
        _composite(axes=[{"name": "preference", "wieght": 2}])


def test_build_composite_from_yaml_with_section_and_overrides(tmp_path):
    y = tmp_path / "recipe.yaml"
    y.write_text("reward:\n  axes:\n    - {name: preference, weight: 1.0}\n    - {name: faithfulness, weight: 2.0}\n"
                 "  normalize: batch\ntrain: {lr: 1.0e-4}\n")
    comp = build_composite(y, ["normalize=none"], section="reward",
                           rewards={"preference": ChannelMean(channel=0), "faithfulness": ChannelMean(channel=2)})
    assert comp.config.normalize == "none"
    assert close(comp(IMGS, "p").scores, RED + 2.0 * BLUE)
    with pytest.raises(ConfigError, match="unknown"):
        build_composite(y, ["normalise=none"], section="reward")


def test_composite_tiny_is_batch_relative_and_conforms(tmp_path):
    """A batch-relative reward: conformance compares it with the whole call (see rewardkit.conformance). Every
    conformance check runs on this very instance (the registry's ``composite`` and its ``tiny``) in
    tests/contract/test_conformance.py (``composite-*``), so they are not repeated here."""
    from rewardkit.registry import get_reward_class

    comp = Composite.tiny(str(tmp_path))
    assert comp.batch_relative and not WeightedSum.tiny(str(tmp_path)).batch_relative
    assert get_reward_class("composite") is Composite  # (what test_conformance builds)
    prompts = ["a", "b", "c", "d"]
    out = comp(IMGS, prompts)
    assert set(out.dimensions) == {"preference/raw", "preference/z", "alignment/raw", "alignment/z"}
    # expected value from the sub-rewards scored on their own and a numpy z-score (not from out.dimensions)
    def z(x):  # the composite's default, zscore="rl": (x - mean) / (std + 1e-4)
        x = np.asarray(x, dtype=np.float64)
        return (x - x.mean()) / (x.std() + 1e-4)
    pref = comp.rewards["preference"](IMGS, prompts).scores.numpy()
    align = comp.rewards["alignment"](IMGS, prompts).scores.numpy()
    assert np.ptp(pref) > 0 and np.ptp(align) > 0
    assert np.allclose(out.scores.numpy(), z(pref) + 0.5 * z(align), atol=1e-4)


class EmptyPromptChannelMean(ChannelMean):
    """ChannelMean that, like pickscore / hpsv2, scores an empty prompt."""

    name = "test-channel-mean-empty-ok"
    scores_empty_prompt = True


def test_empty_prompt_follows_the_sub_rewards():
    """An empty prompt is scored iff every prompt-reading sub-reward scores one (WeightedSum.tiny = pickscore +
    clipscore refused it although both score it alone); one that refuses (or an intent judge) refuses it."""
    ok = WeightedSum(axes=[{"name": "r", "weight": 2.0}, {"name": "b", "weight": -0.5}],
                     rewards={"r": EmptyPromptChannelMean(channel=0), "b": EmptyPromptChannelMean(channel=2)})
    out = ok(IMGS, ["", "  ", "", "p"], on_error="nan")
    assert bool(out.valid.all()) and close(out.scores, 2.0 * RED - 0.5 * BLUE)
    mixed = WeightedSum(axes=[{"name": "r", "weight": 2.0}, {"name": "b", "weight": -0.5}],
                        rewards={"r": EmptyPromptChannelMean(channel=0), "b": ChannelMean(channel=2)})
    out = mixed(IMGS, ["", "p", "p", "p"], on_error="nan")
    assert out.valid.tolist() == [False, True, True, True] and out.errors[0] == "prompt is empty"
    gated = Composite(axes=[{"name": "r"}, {"name": "b", "gate": "intent"}],
                      rewards={"r": EmptyPromptChannelMean(channel=0), "b": EmptyPromptChannelMean(channel=2)},
                      judge=object())
    assert not gated.scores_empty_prompt


def test_zscore_eps_bounds_and_messages():
    x = torch.tensor([1.0, 2.0, 4.0])
    # catches `eps > 0` in cutoff mode: eps = 0 is allowed there (an exactly constant axis still gives 0)
    assert zscore(x, eps=0.0).tolist() == pytest.approx(((x - x.mean()) / x.std(unbiased=False)).tolist())
    assert zscore(torch.tensor([3.0, 3.0]), eps=0.0).tolist() == [0.0, 0.0]
    # catches `eps <= inf` and the rl-mode check dropped, and each message's wording
    with pytest.raises(ValueError, match=r"^eps must be finite and >= 0, got inf$"):
        zscore(x, eps=float("inf"))
    with pytest.raises(ValueError, match=r"^eps must be finite and > 0, got 0.0$"):
        zscore(x, eps=0.0, mode="rl")
    with pytest.raises(ValueError, match=r"^eps must be finite and >= 0, got -1.0$"):
        zscore(x, eps=-1.0)
