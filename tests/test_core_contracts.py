"""Documented contracts of the pure cores that the formula tests leave open (found by mutation testing):
output dtype (float32 ``[B]`` whatever the input dtype), default arguments, error cases, exact thresholds.

Expected values are hand-computed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rewardkit.compose import functions as F
from rewardkit.train import losses as L

NAN = float("nan")


# ------------------------------------------------------------------ compose/functions.py
@pytest.mark.parametrize("x", [[1, 2, 3], torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), np.array([1, 2, 3])])
def test_zscore_returns_float32_for_any_input_dtype(x):
    z = F.zscore(x)
    s = math.sqrt(2 / 3)
    assert z.dtype == torch.float32 and z.shape == (3,)
    assert torch.allclose(z, torch.tensor([-1 / s, 0.0, 1 / s]), atol=1e-6)
    g = F.group_zscore(x, ["a", "a", "a"])
    assert g.dtype == torch.float32 and torch.allclose(g, z)


def test_zscore_default_eps_boundary():
    # population std 5e-7 < 1e-6: zero-variance -> zeros; std 2e-6 > 1e-6 -> +-1
    assert torch.equal(F.zscore(torch.tensor([0.0, 1e-6])), torch.zeros(2))
    assert torch.allclose(F.zscore(torch.tensor([0.0, 4e-6])), torch.tensor([-1.0, 1.0]), atol=1e-3)
    # "below eps" is strict: std exactly equal to eps (here 1.0) still gives z-scores
    assert F.zscore(torch.tensor([0.0, 2.0]), eps=1.0).tolist() == [-1.0, 1.0]
    # explicit eps moves the boundary
    assert torch.equal(F.zscore(torch.tensor([0.0, 4e-6]), eps=1e-5), torch.zeros(2))
    assert torch.allclose(F.group_zscore(torch.tensor([0.0, 4e-6]), [1, 1]), torch.tensor([-1.0, 1.0]), atol=1e-3)
    assert torch.equal(F.group_zscore(torch.tensor([0.0, 4e-6]), [1, 1], eps=1e-5), torch.zeros(2))


def test_zscore_inf_is_excluded_and_all_masked_is_nan():
    z = F.zscore(torch.tensor([1.0, float("inf"), 3.0]))
    assert torch.allclose(z, torch.tensor([-1.0, NAN, 1.0]), equal_nan=True)
    assert torch.isnan(F.zscore(torch.tensor([1.0, 2.0]), mask=torch.tensor([False, False]))).all()
    assert F.zscore(torch.tensor([1.0, 2.0]), mask=[True, False]).tolist()[0] == 0.0   # one sample: 0
    # an integer 0/1 mask is a mask, not a list of indices: stats over x[0], x[2] = {1, 5}
    z = F.zscore(torch.tensor([1.0, 3.0, 5.0]), mask=torch.tensor([1, 0, 1]))
    assert torch.allclose(z, torch.tensor([-1.0, NAN, 1.0]), equal_nan=True)


def test_group_zscore_mask_and_bad_keys():
    z = F.group_zscore(torch.tensor([1.0, 3.0, 5.0, 100.0]), ["a", "a", "a", "a"], mask=[True, True, False, True])
    # stats over {1, 3, 100}
    x = np.array([1.0, 3.0, 100.0])
    want = (x - x.mean()) / x.std()
    assert torch.allclose(z, torch.tensor([want[0], want[1], NAN, want[2]], dtype=torch.float32), equal_nan=True)
    with pytest.raises(ValueError, match="^got 2 group keys for 4 values$"):
        F.group_zscore(torch.zeros(4), ["a", "b"])


def test_intent_gate_default_and_dtype():
    g = F.intent_gate(["strict", "neutral", "open", None])
    assert g.dtype == torch.float32 and g.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert F.intent_gate(["open", None], on=["open"]).tolist() == [1.0, 0.0]
    assert F.INTENT_LABELS == ("strict", "neutral", "open")


def test_veto_default_strength_and_dtype():
    z = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    out = F.veto(z, [1, 1, 0])                          # int "fired", default strength 1: clip at 0
    assert out.dtype == torch.float32 and out.tolist() == [0.0, -1.0, 0.5]
    assert F.veto([2, -1], [True, False], strength=0.25).tolist() == [1.5, -1.0]


def test_additive_penalty_default_and_dtype():
    z = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    out = F.additive_penalty(z, [1, 1, 0])              # default penalty 1
    assert out.dtype == torch.float32 and out.tolist() == [1.0, -2.0, 0.5]
    assert F.additive_penalty([2, -1], [True, False], penalty=0.5).tolist() == [1.5, -1.0]


def test_combine_dtypes_gates_and_errors():
    a = torch.tensor([1.0, 2.0], dtype=torch.float64)
    b = [3, NAN]
    out = F.combine([a, b], [2.0, 0.5], [None, torch.tensor([1, 0])])
    assert out.dtype == torch.float32 and out.tolist() == [2.0 + 1.5, 4.0]     # gated-off NaN -> exactly 0
    # a gate value is a multiplier where open (documented 0/1, but a soft gate scales)
    assert F.combine([[2.0]], [1.0], [[0.5]]).tolist() == [1.0]
    # an open gate on a NaN z-score makes the sum NaN (the caller reports why)
    assert math.isnan(F.combine([[NAN]], [1.0], [[1.0]]).item())
    assert F.combine([[1, 2]], [3]).tolist() == [3.0, 6.0]                      # gates default to None
    with pytest.raises(ValueError, match="^2 terms but 1 weights$"):
        F.combine([a, a], [1.0])
    with pytest.raises(ValueError, match="^combine needs at least one term$"):
        F.combine([], [])


# ------------------------------------------------------------------ train/losses.py
t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731


def test_bt_center_coefficient_and_weights_hand_values():
    r_w, r_l = t(1.0, 0.0), t(0.0, 1.0)
    base = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2
    assert float(L.bradley_terry_loss(r_w, r_l)) == pytest.approx(base, rel=1e-12)
    # centering: + c * mean((r_w + r_l)^2) = c * 1
    assert float(L.bradley_terry_loss(r_w, r_l, center_coef=0.5)) == pytest.approx(base + 0.5, rel=1e-12)
    w = t(3.0, 1.0)
    wb = (3 * math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 4
    assert float(L.bradley_terry_loss(r_w, r_l, weight=w, center_coef=0.5)) == pytest.approx(wb + 0.5, rel=1e-12)
    # a scalar margin
    assert float(L.bradley_terry_loss(t(2.0), t(0.0), margin=0.5)) == pytest.approx(math.log1p(math.exp(-1.5)))


def test_weighted_mean_zero_weights_is_finite():
    # all-zero weights: the denominator is clamped, the loss is 0 (not NaN / inf)
    got = L.bradley_terry_loss(t(1.0), t(0.0), weight=t(0.0))
    assert float(got) == 0.0


def test_tie_models_reject_bad_parameters_and_hand_values():
    with pytest.raises(ValueError, match="^Rao-Kupper theta must be > 1"):
        L.rao_kupper_probs(t(0.0), t(0.0), 1.0)
    with pytest.raises(ValueError, match="^Davidson nu must be > 0"):
        L.davidson_probs(t(0.0), t(0.0), 0.0)
    # Rao-Kupper at ra = rb, theta = 3: P(a>b) = 1/4, P(tie) = 8 * 1/16 = 1/2
    la, lb, lt = L.rao_kupper_probs(t(0.0), t(0.0), 3.0)
    assert math.exp(float(la)) == pytest.approx(0.25) and math.exp(float(lt)) == pytest.approx(0.5)
    # Davidson at ra = rb, nu = 2: P(a>b) = 1/4, P(tie) = 1/2
    da, db, dt = L.davidson_probs(t(0.0), t(0.0), 2.0)
    assert math.exp(float(da)) == pytest.approx(0.25) and math.exp(float(dt)) == pytest.approx(0.5)
    labels = torch.tensor([L.LABEL_A, L.LABEL_TIE])
    assert float(L.rao_kupper_loss(t(0.0, 0.0), t(0.0, 0.0), labels, theta=3.0)) == pytest.approx(
        (math.log(4) + math.log(2)) / 2)
    assert float(L.davidson_loss(t(0.0, 0.0), t(0.0, 0.0), labels, nu=2.0,
                                 weight=t(1.0, 3.0))) == pytest.approx((math.log(4) + 3 * math.log(2)) / 4)


def test_pairwise_accuracy_all_ties_and_reward_stats_empty():
    acc, n = L.pairwise_accuracy(t(1.0), t(0.0), torch.tensor([L.LABEL_TIE]))
    assert math.isnan(acc) and n == 0
    acc, n = L.pairwise_accuracy(t(1.0, 0.0, 2.0), t(0.0, 1.0, 2.0), torch.tensor([L.LABEL_A, L.LABEL_A, L.LABEL_B]))
    assert (acc, n) == (pytest.approx(0.5), 3)      # right, wrong, equal (half)
    assert L.reward_stats(torch.zeros(0)) == {}
    s = L.reward_stats(t(1.0, 3.0))
    assert s == {"reward_mean": 2.0, "reward_std": 1.0, "reward_min": 1.0, "reward_max": 3.0}


def test_lr_at_edges():
    kw = dict(base_lr=1.0, total_steps=10)
    assert L.lr_at(0, **kw) == 1.0 and L.lr_at(10, **kw) == pytest.approx(0.0, abs=1e-12)
    assert L.lr_at(5, **kw) == pytest.approx(0.5)
    assert L.lr_at(0, warmup_steps=4, **kw) == 0.25 and L.lr_at(3, warmup_steps=4, **kw) == 1.0
    assert L.lr_at(4, warmup_steps=4, **kw) == 1.0                 # cosine starts at the end of warmup
    assert L.lr_at(7, warmup_steps=4, **kw) == pytest.approx(0.5)  # halfway through the 6 decay steps
    assert L.lr_at(10, min_lr_ratio=0.1, **kw) == pytest.approx(0.1)
    assert L.lr_at(20, min_lr_ratio=0.1, **kw) == pytest.approx(0.1)   # clamped after the end
    assert L.lr_at(3, schedule="constant", warmup_steps=2, **kw) == 1.0
    assert L.lr_at(0, schedule="constant", warmup_steps=2, **kw) == 0.5
    with pytest.raises(ValueError, match="^unknown lr schedule .linear.; use .cosine. or .constant.$"):
        L.lr_at(0, schedule="linear", **kw)


def test_float32_outputs_even_when_the_host_sets_a_float64_default_dtype():
    """Host programs sometimes call torch.set_default_dtype(torch.float64): the documented float32 [B] holds."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        outs = [F.zscore([1.0, 2.0]), F.group_zscore([1.0, 2.0], [0, 0]), F.intent_gate(["strict", None]),
                F.veto(torch.tensor([1.0, -1.0], dtype=torch.float32), [1, 0]),
                F.veto(torch.tensor([1.0, -1.0], dtype=torch.float32), [True, False], strength=0.5),
                F.additive_penalty(torch.tensor([1.0, -1.0], dtype=torch.float32), [1, 0]),
                F.combine([[1.0, 2.0]], [1.0], [[1, 0]]), F.combine([[1.0, 2.0]], [1.0], [[1.0, 0.0]])]
    finally:
        torch.set_default_dtype(old)
    assert [o.dtype for o in outs] == [torch.float32] * len(outs)
    assert outs[2].tolist() == [1.0, 0.0] and outs[3].tolist() == [0.0, -1.0] and outs[4].tolist() == [0.5, -1.0]
    assert outs[5].tolist() == [0.0, -1.0] and outs[6].tolist() == [1.0, 0.0]


def test_pairwise_accuracy_b_wins_and_weighted_rao_kupper():
    # b wins every pair: b higher in two (right), a higher in one (wrong)
    acc, n = L.pairwise_accuracy(t(0.0, 0.0, 2.0), t(1.0, 1.0, 1.0), torch.tensor([L.LABEL_B] * 3))
    assert (acc, n) == (pytest.approx(2 / 3), 3)
    labels = torch.tensor([L.LABEL_A, L.LABEL_TIE])
    # theta = 3 at ra = rb: -log P(a>b) = log 4, -log P(tie) = log 2; weights 1 and 3
    got = L.rao_kupper_loss(t(0.0, 0.0), t(0.0, 0.0), labels, theta=3.0, weight=t(1.0, 3.0))
    assert float(got) == pytest.approx((math.log(4) + 3 * math.log(2)) / 4)
    with pytest.raises(ValueError, match="^winner_loser got tie labels; drop ties or use a tie-aware loss$"):
        L.winner_loser(t(0.0), t(1.0), torch.tensor([L.LABEL_TIE]))


def test_loss_dtype_follows_the_rewards_not_margin_or_weight():
    r_w, r_l = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.5])          # float32 rewards
    m64, w64 = torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64)
    for loss in (L.bradley_terry_loss(r_w, r_l, margin=m64, weight=w64),
                 L.uncertainty_loss(r_w, torch.zeros(2), r_l, torch.zeros(2), margin=m64, weight=w64)):
        assert loss.dtype == torch.float32


def test_centering_term_is_weighted_and_uses_the_sum():
    r_w, r_l, w = t(2.0, 1.0), t(1.0, 0.0), t(3.0, 1.0)
    bt = (3 * math.log1p(math.exp(-1.0)) + math.log1p(math.exp(-1.0))) / 4
    # (r_w + r_l)^2 = [9, 1], weighted mean (27 + 1) / 4 = 7
    assert float(L.bradley_terry_loss(r_w, r_l, weight=w, center_coef=0.5)) == pytest.approx(bt + 0.5 * 7)


def test_tie_models_use_the_reward_difference_and_default_parameters():
    ra, rb = t(1.0), t(0.5)
    la, lb, lt = L.rao_kupper_probs(ra, rb, 3.0)
    ea, eb = math.exp(1.0), math.exp(0.5)
    assert math.exp(float(la)) == pytest.approx(ea / (ea + 3 * eb))
    assert math.exp(float(lt)) == pytest.approx(8 * ea * eb / ((ea + 3 * eb) * (eb + 3 * ea)))
    da, db, dt = L.davidson_probs(ra, rb, 2.0)
    den = ea + eb + 2 * math.sqrt(ea * eb)
    assert math.exp(float(da)) == pytest.approx(ea / den) and math.exp(float(dt)) == pytest.approx(
        2 * math.sqrt(ea * eb) / den)
    lab = torch.tensor([L.LABEL_TIE])
    # defaults: theta = 2 (P(tie) = 3 / 9 at equal rewards), nu = 1 (P(tie) = 1 / 3)
    assert float(L.rao_kupper_loss(t(0.0), t(0.0), lab)) == pytest.approx(-math.log(3 / 9))
    assert float(L.davidson_loss(t(0.0), t(0.0), lab)) == pytest.approx(-math.log(1 / 3))


def test_lr_at_short_runs_and_min_ratio():
    assert L.lr_at(1, base_lr=1.0, total_steps=1) == pytest.approx(0.0, abs=1e-12)   # one decay step: done
    kw = dict(base_lr=2.0, total_steps=10, min_lr_ratio=0.1)
    assert L.lr_at(0, **kw) == pytest.approx(2.0)
    assert L.lr_at(5, **kw) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))
