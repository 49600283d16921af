"""Preference losses, metrics, LR schedule and calibration maths on hand-computed cases."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rewardkit.models.preference import apply_calibration, calibration_stats
from rewardkit.train import losses as L
from rewardkit.train.data import normalize_label

A, B, T = L.LABEL_A, L.LABEL_B, L.LABEL_TIE


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_bradley_terry_hand_values():
    # -log sigmoid(2) = log(1 + e^-2)
    assert float(L.bradley_terry_loss(t(2.0), t(0.0))) == pytest.approx(math.log1p(math.exp(-2)), abs=1e-12)
    # margin 1: -log sigmoid(2 - 0 - 1) = log(1 + e^-1)
    assert float(L.bradley_terry_loss(t(2.0), t(0.0), margin=t(1.0))) == pytest.approx(math.log1p(math.exp(-1)), abs=1e-12)
    # equal rewards: log 2
    assert float(L.bradley_terry_loss(t(0.3), t(0.3))) == pytest.approx(math.log(2), abs=1e-12)
    # centering: 0.5 * (2 + 0)^2 = 2 added
    assert float(L.bradley_terry_loss(t(2.0), t(0.0), center_coef=0.5)) == pytest.approx(math.log1p(math.exp(-2)) + 2.0)


def test_bradley_terry_weighted_mean():
    l1, l2 = math.log1p(math.exp(-1)), math.log1p(math.exp(1))  # pair 1 right by 1, pair 2 wrong by 1
    got = L.bradley_terry_loss(t(1.0, 0.0), t(0.0, 1.0), weight=t(3.0, 1.0))
    assert float(got) == pytest.approx((3 * l1 + l2) / 4, abs=1e-12)


def test_winner_loser_orders_and_refuses_ties():
    w, l = L.winner_loser(t(1.0, 2.0), t(5.0, 6.0), torch.tensor([A, B]))
    assert w.tolist() == [1.0, 6.0] and l.tolist() == [5.0, 2.0]
    with pytest.raises(ValueError, match="tie"):
        L.winner_loser(t(1.0), t(2.0), torch.tensor([T]))


def test_rao_kupper_hand_values():
    # r_a = r_b, theta = 2: P(a) = 1/(1+2) = 1/3, P(tie) = (4-1) * 1/3 * 1/3 = 1/3
    pa, pb, pt = (x.exp().item() for x in L.rao_kupper_probs(t(0.0), t(0.0), 2.0))
    assert (pa, pb, pt) == pytest.approx((1 / 3, 1 / 3, 1 / 3), abs=1e-12)
    # r_a = log 3, r_b = 0, theta = 2: P(a) = 3/(3+2) = 3/5, P(b) = 1/(1+6) = 1/7, tie = 3 * 3/5 * 1/7 = 9/35
    pa, pb, pt = (x.exp().item() for x in L.rao_kupper_probs(t(math.log(3)), t(0.0), 2.0))
    assert (pa, pb, pt) == pytest.approx((3 / 5, 1 / 7, 9 / 35), abs=1e-12)
    assert pa + pb + pt == pytest.approx(1.0, abs=1e-12)
    loss = L.rao_kupper_loss(t(math.log(3), 0.0), t(0.0, 0.0), torch.tensor([T, A]), theta=2.0)
    assert float(loss) == pytest.approx((-math.log(9 / 35) - math.log(1 / 3)) / 2, abs=1e-12)
    with pytest.raises(ValueError):
        L.rao_kupper_probs(t(0.0), t(0.0), 1.0)


def test_davidson_hand_values():
    # e^ra = 4, e^rb = 1, nu = 1: D = 4 + 1 + sqrt(4) = 7
    pa, pb, pt = (x.exp().item() for x in L.davidson_probs(t(math.log(4)), t(0.0), 1.0))
    assert (pa, pb, pt) == pytest.approx((4 / 7, 1 / 7, 2 / 7), abs=1e-12)
    loss = L.davidson_loss(t(math.log(4)), t(0.0), torch.tensor([B]), nu=1.0)
    assert float(loss) == pytest.approx(math.log(7), abs=1e-12)


def test_tie_models_sum_to_one_random():
    g = torch.Generator().manual_seed(0)
    ra, rb = torch.randn(50, generator=g, dtype=torch.float64) * 3, torch.randn(50, generator=g, dtype=torch.float64) * 3
    for probs in (L.rao_kupper_probs(ra, rb, 1.7), L.davidson_probs(ra, rb, 0.4)):
        total = sum(p.exp() for p in probs)
        assert torch.allclose(total, torch.ones_like(total), atol=1e-12)


def test_uncertainty_loss_hand_value():
    # mu gap 1, sigma_w = sigma_l = 1: P = Phi(1 / sqrt 2)
    phi = 0.5 * (1 + math.erf((1 / math.sqrt(2)) / math.sqrt(2)))
    got = L.uncertainty_loss(t(1.0), t(0.0), t(0.0), t(0.0), form="probit")
    assert float(got) == pytest.approx(-math.log(phi), abs=1e-10)
    # a larger sigma makes a correct ranking less certain: the loss rises toward log 2
    wide = L.uncertainty_loss(t(1.0), t(3.0), t(0.0), t(3.0), form="probit")
    assert float(got) < float(wide) < math.log(2)


def test_losses_backpropagate():
    r = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    L.bradley_terry_loss(r[:2], r[2:]).backward()
    # d/dr_w of -log sigmoid(r_w - r_l) at 0 = -1/2, averaged over 2 pairs
    assert r.grad.tolist() == pytest.approx([-0.25, -0.25, 0.25, 0.25])


def test_pairwise_accuracy_counts_equal_scores_as_half_and_skips_ties():
    acc, n = L.pairwise_accuracy(t(1.0, 0.0, 2.0, 5.0), t(0.0, 1.0, 2.0, 0.0), torch.tensor([A, A, A, T]))
    assert n == 3 and acc == pytest.approx((1 + 0 + 0.5) / 3)
    acc, n = L.pairwise_accuracy(t(1.0), t(1.0), torch.tensor([T]))
    assert n == 0 and math.isnan(acc)


def test_reward_stats():
    s = L.reward_stats(t(1.0, 2.0, 3.0, 4.0))
    assert s == pytest.approx({"reward_mean": 2.5, "reward_std": math.sqrt(1.25), "reward_min": 1.0, "reward_max": 4.0})


def test_lr_schedule_hand_values():
    kw = dict(base_lr=1.0, total_steps=10, warmup_steps=2)
    assert [L.lr_at(s, **kw) for s in (0, 1, 2)] == pytest.approx([0.5, 1.0, 1.0])
    assert L.lr_at(6, **kw) == pytest.approx(0.5)       # half-way through the cosine span of 8 steps
    assert L.lr_at(10, **kw) == pytest.approx(0.0, abs=1e-12)
    assert L.lr_at(10, **kw, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert L.lr_at(7, base_lr=2.0, total_steps=10, schedule="constant") == 2.0
    with pytest.raises(ValueError):
        L.lr_at(0, base_lr=1.0, total_steps=1, schedule="linear")


def test_calibration_stats_and_normalisation():
    st = calibration_stats(torch.tensor([1.0, 2.0, 3.0, 4.0, float("nan")]), quantiles=(0.0, 0.5, 1.0))
    assert st["n"] == 4 and st["mean"] == pytest.approx(2.5) and st["std"] == pytest.approx(math.sqrt(1.25))
    assert st["quantiles"] == pytest.approx({"0": 1.0, "0.5": 2.5, "1": 4.0})
    z = apply_calibration(torch.tensor([2.5, 2.5 + math.sqrt(1.25)]), st, "calibration")
    assert z.tolist() == pytest.approx([0.0, 1.0], abs=1e-6)
    q = apply_calibration(torch.tensor([0.0, 1.0, 1.75, 2.5, 3.25, 9.0]), st, "quantile")
    assert q.tolist() == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75, 1.0], abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        calibration_stats(torch.tensor([1.0]))


@pytest.mark.parametrize("raw,want", [("A", A), ("b", B), ("tie", T), ("model_a", A), ("rightvote", B),
                                      ("bothbad_vote", T), (0, A), (1, B)])
def test_normalize_label(raw, want):
    assert normalize_label(raw) == want


@pytest.mark.parametrize("bad", ["C", None, True, 2, ""])
def test_normalize_label_rejects(bad):
    with pytest.raises(ValueError, match="label"):
        normalize_label(bad)


# ------------------------------------------------------------------ HPSv3's Monte-Carlo uncertainty loss
def _expected_neg_logsigmoid(d: float, s: float) -> float:
    """E[-log sigmoid(z)], z ~ N(d, s^2), by trapezoidal integration over +-12 sigma (independent of the code)."""
    n = 200_001
    z = torch.linspace(d - 12 * s, d + 12 * s, n, dtype=torch.float64)
    pdf = torch.exp(-0.5 * ((z - d) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    return float(torch.trapezoid(-torch.nn.functional.logsigmoid(z) * pdf, z))


@pytest.mark.parametrize("mu_w, ls_w, mu_l, ls_l", [(1.0, 0.0, 0.0, 0.0), (-0.5, 0.3, 0.7, -0.2), (2.0, -1.0, 0.0, 0.5)])
def test_hpsv3_monte_carlo_matches_the_integrated_expectation(mu_w, ls_w, mu_l, ls_l):
    s = math.sqrt(math.exp(2 * ls_w) + math.exp(2 * ls_l))
    want = _expected_neg_logsigmoid(mu_w - mu_l, s)
    n = 400_000
    got = float(L.uncertainty_hpsv3_loss(t(mu_w), t(ls_w), t(mu_l), t(ls_l), samples=n, seed=3))
    # standard error of the estimate, from the samples' spread
    g = torch.Generator().manual_seed(3)
    z = (mu_w - mu_l) + s * torch.randn((1, n), generator=g, dtype=torch.float64)
    se = float((-torch.nn.functional.logsigmoid(z)).std()) / math.sqrt(n)
    assert abs(got - want) < 4 * se + 1e-9, (got, want, se)
    # and it is not the probit closed form
    probit = float(L.uncertainty_probit_loss(t(mu_w), t(ls_w), t(mu_l), t(ls_l)))
    assert abs(probit - want) > 10 * se


def test_hpsv3_loss_is_seeded_and_reproducible():
    args = (torch.tensor([0.3, -1.0], dtype=torch.float64), torch.tensor([0.1, 0.2], dtype=torch.float64),
            torch.tensor([0.0, 0.5], dtype=torch.float64), torch.tensor([-0.3, 0.0], dtype=torch.float64))
    a = L.uncertainty_loss(*args, seed=7)
    assert torch.equal(a, L.uncertainty_loss(*args, seed=7))
    assert not torch.equal(a, L.uncertainty_loss(*args, seed=8))


def test_raising_sigma_on_a_misranked_pair_raises_the_hpsv3_loss():
    """mu_w < mu_l (the model ranks the pair wrongly). HPSv3's loss rises with sigma; the probit form falls,
    which is the incentive to inflate sigma that HPSv3's objective does not have."""
    mu_w, mu_l = t(-1.0), t(1.0)
    sigmas = [-2.0, -1.0, 0.0, 0.5, 1.0, 2.0]
    hps = [float(L.uncertainty_loss(mu_w, t(ls), mu_l, t(ls), samples=20_000, seed=0)) for ls in sigmas]
    exact = [_expected_neg_logsigmoid(-2.0, math.sqrt(2) * math.exp(ls)) for ls in sigmas]
    probit = [float(L.uncertainty_loss(mu_w, t(ls), mu_l, t(ls), form="probit")) for ls in sigmas]
    assert all(x < y for x, y in zip(hps, hps[1:])), hps
    assert all(x < y for x, y in zip(exact, exact[1:])), exact
    assert all(x > y for x, y in zip(probit, probit[1:])), probit
    # gradient w.r.t. log sigma is positive under HPSv3 (pushes sigma down), negative under probit
    ls = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    L.uncertainty_loss(mu_w, ls, mu_l, ls, samples=4096, seed=1).backward()
    assert float(ls.grad) > 0
    ls2 = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    L.uncertainty_loss(mu_w, ls2, mu_l, ls2, form="probit").backward()
    assert float(ls2.grad) < 0


def test_uncertainty_form_is_checked():
    with pytest.raises(ValueError, match="form"):
        L.uncertainty_loss(t(0.0), t(0.0), t(0.0), t(0.0), form="closed")
    with pytest.raises(ValueError, match="samples"):
        L.uncertainty_loss(t(0.0), t(0.0), t(0.0), t(0.0), samples=0)


# ------------------------------------------------------------------ uncertainty loss: sign of the margin
def _phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("margin", [0.5, -0.7, 2.0])
def test_uncertainty_loss_margin_is_subtracted(margin):
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    mu_w, mu_l, ls_w, ls_l = 1.0, 0.2, math.log(0.5), math.log(1.5)
    scale = math.sqrt(0.5 ** 2 + 1.5 ** 2)
    want = -math.log(_phi((mu_w - mu_l - margin) / scale))
    got = L.uncertainty_loss(t(mu_w), t(ls_w), t(mu_l), t(ls_l), margin=t(margin), form="probit")
    assert float(got) == pytest.approx(want, rel=1e-9)
    # a larger required gap makes the loss larger (monotone in the margin)
    more = L.uncertainty_loss(t(mu_w), t(ls_w), t(mu_l), t(ls_l), margin=t(margin + 0.3), form="probit")
    assert float(more) > float(got)


def test_uncertainty_loss_weighted_margin_per_pair():
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    mu_w, mu_l, m, w = [1.0, 0.0], [0.0, 0.5], [0.25, -0.25], [1.0, 3.0]
    per = [-math.log(_phi((a - b - mm) / math.sqrt(2))) for a, b, mm in zip(mu_w, mu_l, m)]
    want = (per[0] * w[0] + per[1] * w[1]) / sum(w)
    got = L.uncertainty_loss(t(*mu_w), t(0, 0), t(*mu_l), t(0, 0), margin=t(*m), weight=t(*w), form="probit")
    assert float(got) == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------ the trainer passes the data's margin
@pytest.mark.parametrize("kind", ["bt", "uncertainty"])
def test_trainer_loss_uses_the_batch_margin_and_weight(kind):
    from rewardkit.train.trainer import PreferenceTrainer

    fake = SimpleNamespace(cfg=SimpleNamespace(loss=SimpleNamespace(kind=kind, center_coef=0.0, theta=2.0, nu=1.0,
                                                                    uncertainty_form="probit",
                                                                    uncertainty_samples=32)))
    r = torch.tensor([1.0, 0.0, 0.3, 0.4], dtype=torch.float64)      # [a0, a1, b0, b1]
    ls = torch.tensor([0.0, math.log(2.0), math.log(0.5), 0.0], dtype=torch.float64)
    labels = torch.tensor([L.LABEL_A, L.LABEL_B])                       # pair 0: a wins; pair 1: b wins
    margin = torch.tensor([0.5, -0.2], dtype=torch.float64)
    weight = torch.tensor([1.0, 2.0], dtype=torch.float64)
    loss, r_a, r_b = PreferenceTrainer._loss(fake, r, ls, {"labels": labels, "margin": margin, "weight": weight})
    # winner / loser by hand: pair 0 (a0=1.0 vs b0=0.3), pair 1 (b1=0.4 vs a1=0.0)
    d = [1.0 - 0.3 - 0.5, 0.4 - 0.0 + 0.2]
    if kind == "bt":
        per = [math.log1p(math.exp(-x)) for x in d]
    else:
        sig = [math.sqrt(1.0 + 0.25), math.sqrt(1.0 + 4.0)]            # (sigma_w, sigma_l): (1, .5), (1, 2)
        per = [-math.log(_phi(x / s)) for x, s in zip(d, sig)]
    want = (per[0] * 1.0 + per[1] * 2.0) / 3.0
    assert float(loss) == pytest.approx(want, rel=1e-9)
    assert r_a.tolist() == [1.0, 0.0] and r_b.tolist() == [0.3, 0.4]


def test_hpsv3_loss_is_its_formula_on_the_documented_draws_with_weights():
    # reference: the docstring's formula on its draws, float64 N(0, 1) [B, samples] from Generator().manual_seed
    # (seed), with -log sigmoid(z) = log(1 + exp(-z)), written out here
    f64 = dict(dtype=torch.float64)
    mu_w, ls_w = torch.tensor([0.3, -0.2], **f64), torch.tensor([-0.5, 0.1], **f64)
    mu_l, ls_l = torch.tensor([0.1, 0.4], **f64), torch.tensor([0.2, -1.0], **f64)
    w = torch.tensor([1.0, 3.0], **f64)
    eps = torch.randn((2, 8), generator=torch.Generator().manual_seed(5), **f64)
    scale = torch.sqrt(torch.exp(2 * ls_w) + torch.exp(2 * ls_l))
    per_pair = torch.log1p(torch.exp(-((mu_w - mu_l)[:, None] + scale[:, None] * eps))).mean(-1)
    expected = float((per_pair * w).sum() / w.sum())
    # catches float32 draws (another sequence) and a dropped weight
    got = L.uncertainty_hpsv3_loss(mu_w, ls_w, mu_l, ls_l, weight=w, samples=8, seed=5)
    assert float(got) == pytest.approx(expected, rel=1e-12)
    # catches uncertainty_loss not forwarding `weight` to the HPSv3 form (its default)
    assert float(L.uncertainty_loss(mu_w, ls_w, mu_l, ls_l, weight=w, samples=8, seed=5)) == pytest.approx(expected, rel=1e-12)
    assert float((per_pair * w).sum() / w.sum()) != pytest.approx(float(per_pair.mean()), rel=1e-3)  # the weights matter
