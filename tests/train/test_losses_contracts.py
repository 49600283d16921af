"""Documented contracts of ``rewardkit.train.losses`` that the formula tests leave open (found by mutation
testing): output dtype, default arguments, error cases, exact thresholds, the learning-rate schedule's edges.

Expected values are hand-computed.
"""

from __future__ import annotations

import math

import pytest
import torch

from rewardkit.compose import functions as F
from rewardkit.train import losses as L


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
