"""DiffusionNFT / E²PO math on hand-computed cases: schedules, solvers, advantages, the NFT loss, soft update / EMA,
E²PO losses, gamma, masks."""

from __future__ import annotations

import math

import pytest
import torch

from rewardkit.rl import exploration as X
from rewardkit.rl import nft, schedule, solvers


# ------------------------------------------------------------------------------------------ schedules
def test_ten_step_sigmas_match_sd3_schedule():
    s = schedule.flow_sigmas(10, shift=3.0)
    expected = [1.0, 0.9601, 0.9133, 0.8577, 0.7904, 0.7073, 0.6022, 0.4649, 0.278, 0.0089, 0.0]
    assert s.tolist() == pytest.approx(expected, abs=6e-5)
    # by hand: sigma_min = 3*0.001/(1+0.002); second point of linspace(1, sigma_min, 10) shifted again
    smin = 0.003 / 1.002
    p = 1 - (1 - smin) / 9
    assert float(s[1]) == pytest.approx(3 * p / (1 + 2 * p), abs=1e-12)


def test_sigmas_equal_diffusers_scheduler():
    diffusers = pytest.importorskip("diffusers")
    for n, shift in ((10, 3.0), (25, 3.0), (2, 1.0)):
        sch = diffusers.FlowMatchEulerDiscreteScheduler(shift=shift)
        sch.set_timesteps(n)
        assert torch.allclose(schedule.flow_sigmas(n, shift).float(), sch.sigmas.float(), atol=1e-6)


def test_train_timesteps_are_per_sample_permutations():
    assert schedule.num_train_timesteps(10, 0.99) == 9 and schedule.num_train_timesteps(25, 0.99) == 24
    assert schedule.num_train_timesteps(2, 0.99) == 1
    idx = schedule.train_timestep_indices(6, 10, 9, torch.Generator().manual_seed(0))
    assert idx.shape == (6, 9) and int(idx.max()) <= 9 and int(idx.min()) >= 0
    assert all(len(set(row.tolist())) == 9 for row in idx)
    assert len({tuple(r.tolist()) for r in idx}) > 1  # independent per sample
    with pytest.raises(ValueError):
        schedule.num_train_timesteps(10, 0.0)


def test_decay_schedules():
    assert schedule.old_policy_decay(7, "copy") == 0.0
    assert schedule.old_policy_decay(100, "linear_to_0_5") == pytest.approx(0.1)
    assert schedule.old_policy_decay(10_000, 1) == 0.5
    assert schedule.old_policy_decay(74, 2) == 0.0 and schedule.old_policy_decay(75, 2) == 0.0
    assert schedule.old_policy_decay(95, 2) == pytest.approx(0.15)
    assert schedule.old_policy_decay(10_000, 2) == 0.999
    assert schedule.ema_decay(1) == pytest.approx(2 / 11) and schedule.ema_decay(80) == 0.9
    with pytest.raises(ValueError):
        schedule.old_policy_decay(1, "cosine")


# ------------------------------------------------------------------------------------------ solvers
def _point_mass_velocity(target):
    """Exact velocity when the data distribution is one point: v = (x - x0*) / sigma."""
    return lambda x, sigma, i: (x - target) / sigma


def test_solvers_exact_on_point_mass():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, 4, 4, generator=g)
    noise = torch.randn(2, 3, 4, 4, generator=g)
    sig = schedule.flow_sigmas(10)
    for name in ("euler", "dpm2"):
        out = solvers.sample(name, _point_mass_velocity(target), noise, sig)
        assert torch.allclose(out, target, atol=1e-5), name
    # flow SDE with eta = 0 is Euler, step for step
    v = lambda x, s, i: torch.sin(x) * s + 0.1 * i  # noqa: E731
    a = solvers.euler_ode(v, noise, sig)
    b = solvers.flow_sde(v, noise, sig, eta=0.0)
    assert torch.equal(a, b)


def test_dpm2_second_order_step_by_hand():
    # the model's x0-prediction at step i is preds[i]; check each DPM-Solver++(2M) update by hand
    preds = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([4.0]), torch.tensor([8.0])]
    seen = []

    def v(x, s, i):  # v such that x - s v == preds[i]
        seen.append(x.clone())
        return (x - preds[i]) / s

    x0 = torch.tensor([0.5])
    out = solvers.dpm2(v, x0, [1.0, 0.6, 0.3, 0.1, 0.0])
    x1 = 0.6 * x0 + 0.4 * preds[0]                        # from sigma = 1: alpha = 0, first order
    x2 = 0.5 * x1 + (0.7 - 0.4 * 0.5) * preds[1]          # previous h is inf -> D1 = 0, first order
    lam = lambda s: math.log((1 - s) / s)  # noqa: E731
    r0 = (lam(0.3) - lam(0.6)) / (lam(0.1) - lam(0.3))
    c = 0.9 - 0.7 * (0.1 / 0.3)
    x3 = (0.1 / 0.3) * x2 + c * preds[2] + 0.5 * c * (preds[2] - preds[1]) / r0   # second order
    assert torch.allclose(seen[1], x1) and torch.allclose(seen[2], x2) and torch.allclose(seen[3], x3)
    assert torch.equal(out, preds[3])                      # the last step (to sigma = 0) returns x0


def test_solver_rejects_bad_schedule():
    with pytest.raises(ValueError):
        solvers.euler_ode(lambda x, s, i: x, torch.zeros(1), [0.5, 0.7, 0.0])
    with pytest.raises(ValueError):
        solvers.sample("heun", lambda x, s, i: x, torch.zeros(1), [1.0, 0.0])


# ------------------------------------------------------------------------------------------ advantages
def test_group_advantages_global_std_by_hand():
    r = torch.tensor([1.0, 3.0, 10.0, 14.0])
    g = torch.tensor([0, 0, 1, 1])
    std = math.sqrt(sum((x - 7.0) ** 2 for x in [1, 3, 10, 14]) / 4)  # ddof = 0 over all rewards
    a = nft.group_advantages(r, g)
    assert a.tolist() == pytest.approx([-1 / (std + 1e-4), 1 / (std + 1e-4), -2 / (std + 1e-4), 2 / (std + 1e-4)])
    per_group = nft.group_advantages(r, g, global_std=False)
    assert per_group.tolist() == pytest.approx([-1 / 1.0001, 1 / 1.0001, -2 / 2.0001, 2 / 2.0001])


def test_group_advantages_nan_is_left_out():
    r = torch.tensor([1.0, float("nan"), 3.0, 5.0])
    a = nft.group_advantages(r, torch.tensor([0, 0, 0, 1]))
    assert math.isnan(a[1]) and a[3] == 0.0  # a group of one has advantage 0
    std = torch.tensor([1.0, 3.0, 5.0]).std(unbiased=False).item()
    assert float(a[0]) == pytest.approx(-1 / (std + 1e-4))
    assert torch.isnan(nft.group_advantages(torch.full((3,), float("nan")), torch.zeros(3))).all()


def test_group_advantages_with_a_single_scored_sample():
    # catches a broken zero-std branch (`new_zeros(None)`): one valid reward has std 0, so its advantage is
    # (3 - 3) / (0 + eps) = 0 and the unscored one stays NaN
    a = nft.group_advantages(torch.tensor([float("nan"), 3.0]), torch.tensor([0, 1]))
    assert math.isnan(a[0]) and a[1].item() == 0.0


def test_optimality_probability():
    a = torch.tensor([-7.0, -5.0, -2.5, 0.0, 1.0, 5.0, 9.0, float("nan")])
    r = nft.optimality_probability(a, 5.0)
    assert r[:-1].tolist() == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.6, 1.0, 1.0])
    assert math.isnan(r[-1])
    assert nft.optimality_probability(a[:-1], mode="positive_only").tolist() == pytest.approx([.5, .5, .5, .5, .6, 1, 1])
    assert nft.optimality_probability(a[:-1], mode="negative_only").tolist() == pytest.approx([0, 0, .25, .5, .5, .5, .5])
    # end to end on a hand-computed group: rewards 0, 0, 0, 4 (global std sqrt(3))
    adv = nft.group_advantages(torch.tensor([0.0, 0.0, 0.0, 4.0]), torch.zeros(4, dtype=torch.long))
    s = math.sqrt(3) + 1e-4
    assert nft.optimality_probability(adv).tolist() == pytest.approx([0.5 - 0.1 / s, 0.5 - 0.1 / s, 0.5 - 0.1 / s, 0.5 + 0.3 / s])


def test_optimality_probability_one_only_and_binary_as_the_official_code():
    """scripts/train_nft_sd3.py:910-929 (NVlabs/DiffusionNFT @ 24af5554), transcribed: clip to +-c, then
    one_only: where(A > 0, 1, 0); binary: sign(A); then r = clamp((A / c) / 2 + 0.5, 0, 1)."""
    a = torch.tensor([-7.0, -5.0, -2.5, 0.0, 1e-3, 1.0, 5.0, 9.0])
    c = 5.0

    def official(adv, mode):
        advantages_clip = torch.clamp(adv, -c, c)
        if mode == "one_only":
            advantages_clip = torch.where(advantages_clip > 0, torch.ones_like(advantages_clip),
                                          torch.zeros_like(advantages_clip))
        elif mode == "binary":
            advantages_clip = torch.sign(advantages_clip)
        normalized_advantages_clip = (advantages_clip / c) / 2.0 + 0.5
        return torch.clamp(normalized_advantages_clip, 0, 1)

    # by hand: one_only gives 0.6 for A > 0 and 0.5 otherwise; binary 0.4 / 0.5 / 0.6 by sign
    assert nft.optimality_probability(a, c, "one_only").tolist() == pytest.approx([.5, .5, .5, .5, .6, .6, .6, .6])
    assert nft.optimality_probability(a, c, "binary").tolist() == pytest.approx([.4, .4, .4, .5, .6, .6, .6, .6])
    for mode in ("one_only", "binary"):
        torch.testing.assert_close(nft.optimality_probability(a, c, mode), official(a, mode))
        assert math.isnan(nft.optimality_probability(torch.tensor([float("nan")]), c, mode)[0])  # unscored stays NaN
    with pytest.raises(ValueError, match="adv mode"):
        nft.optimality_probability(a, c, "sft")


def test_zero_std_group_ratio():
    r = torch.tensor([1.0, 1.0, 2.0, 3.0, 5.0, float("nan")])
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    assert nft.zero_std_group_ratio(r, g) == 0.5  # group 2 has one valid reward: not counted


# ------------------------------------------------------------------------------------------ NFT loss
def _batch(seed=0, b=3):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(b, 2, 3, 3, generator=g)
    eps = torch.randn(b, 2, 3, 3, generator=g)
    t = torch.tensor([0.9, 0.5, 0.2])[:b]
    xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    return x0, eps, t, xt, g


def test_nft_loss_beta_one_identities():
    x0, eps, t, xt, g = _batch()
    v_old = torch.randn(x0.shape, generator=g)
    v_th = torch.randn(x0.shape, generator=g)
    r = torch.tensor([1.0, 0.0, 0.3])
    loss, m = nft.nft_loss(v_th, v_old, None, x0, xt, t, r, beta=1.0, self_normalize=False, adv_clip_max=5.0)
    u = eps - x0
    # beta = 1: v+ = v_theta, v- = 2 v_old - v_theta; x0 error = t (u - v)
    tt = t.view(-1, 1, 1, 1)
    lp = ((tt * (u - v_th)) ** 2).flatten(1).mean(1)
    ln = ((tt * (u - (2 * v_old - v_th))) ** 2).flatten(1).mean(1)
    assert float(loss) == pytest.approx(float((r * lp + (1 - r) * ln).mean() * 5), rel=1e-6)
    # self-normalised: divide by mean |t (u - v)| per sample
    loss_n, _ = nft.nft_loss(v_th, v_old, None, x0, xt, t, r, beta=1.0)
    wp = (tt * (u - v_th)).abs().flatten(1).mean(1)
    wn = (tt * (u - (2 * v_old - v_th))).abs().flatten(1).mean(1)
    assert float(loss_n) == pytest.approx(float((r * lp / wp + (1 - r) * ln / wn).mean() * 5), rel=1e-6)


def test_nft_loss_zero_gradient_at_old_with_half():
    x0, eps, t, xt, g = _batch(1)
    v_old = torch.randn(x0.shape, generator=g)
    for beta in (1.0, 0.1):
        v_th = v_old.clone().requires_grad_(True)
        loss, _ = nft.nft_loss(v_th, v_old, None, x0, xt, t, torch.full((3,), 0.5), beta=beta)
        (gr,) = torch.autograd.grad(loss, v_th)
        loss1, _ = nft.nft_loss(v_th, v_old, None, x0, xt, t, torch.ones(3), beta=beta)
        (g1,) = torch.autograd.grad(loss1, v_th)
        assert float(gr.abs().max()) < 1e-7 < 1e-2 < float(g1.abs().max())  # zero up to fp32 rounding


def test_nft_loss_unweighted_optimum():
    # per sample, without weighting: argmin = v_old + (2r - 1)(u - v_old) / beta
    x0, eps, t, xt, g = _batch(2)
    v_old = torch.randn(x0.shape, generator=g)
    r = torch.tensor([0.8, 0.3, 0.5])
    u = eps - x0
    beta = 0.5
    v_star = (v_old + (2 * r.view(-1, 1, 1, 1) - 1) * (u - v_old) / beta).requires_grad_(True)
    loss, _ = nft.nft_loss(v_star, v_old, None, x0, xt, t, r, beta=beta, self_normalize=False)
    (gr,) = torch.autograd.grad(loss, v_star)
    assert float(gr.abs().max()) < 1e-6


def test_nft_loss_kl_and_weight_floor():
    x0, eps, t, xt, g = _batch(3)
    v = eps - x0  # perfect prediction: x0 error is 0, the normaliser hits the 1e-5 floor
    v_ref = v + 1.0
    loss, m = nft.nft_loss(v.clone(), v, v_ref, x0, xt, t, torch.full((3,), 0.7), kl_coef=1e-4)
    assert float(m["kl"]) == pytest.approx(1.0) and float(m["policy_loss"]) < 1e-9
    assert float(loss) == pytest.approx(1e-4, rel=1e-4)  # policy ~ 0 up to fp32 rounding
    with pytest.raises(ValueError):
        nft.nft_loss(v, v, None, x0, xt, t[:2], torch.ones(3))


def _one(x0, xt, t, v_old, v_th):
    f = lambda v: torch.tensor([[[[v]]]])   # one sample, one element: the self-normalised L is |x0 error|
    return f(x0), f(xt), torch.tensor([t]), f(v_old), f(v_th).requires_grad_(True)


def test_nft_loss_beta_point_one_by_hand():
    """beta = 0.1 (the OCR / multi-reward setting), one element: x0 = 0, xt = 1, t = 0.5, v_old = 1, v_theta = 3.
    v+ = 0.1*3 + 0.9*1 = 1.2, v- = 1.1*1 - 0.1*3 = 0.8; x0 errors 1 - 0.5*1.2 = 0.4 and 1 - 0.5*0.8 = 0.6;
    self-normalised L+ = 0.4, L- = 0.6; r = 0.75: policy = (0.75*0.4 + 0.25*0.6) / 0.1 * 5 = 22.5.
    d/dv_theta: dL+ = 2*0.4*(-0.5*0.1)/0.4 = -0.1, dL- = 2*0.6*(0.5*0.1)/0.6 = 0.1 ->
    (0.75*(-0.1) + 0.25*0.1) / 0.1 * 5 = -2.5."""
    # Bug caught (issue 25 mutation survivor): dropping the "/ beta" (the official code divides both terms by
    # config.beta, train_nft_sd3.py:959) gave 2.25 here; beta was only ever valued at 1 by hand before.
    x0, xt, t, v_old, v_th = _one(0.0, 1.0, 0.5, 1.0, 3.0)
    loss, m = nft.nft_loss(v_th, v_old, None, x0, xt, t, torch.tensor([0.75]), beta=0.1, adv_clip_max=5.0)
    assert float(loss) == pytest.approx(22.5, rel=1e-6)
    assert float(m["policy_loss"]) == pytest.approx(22.5, rel=1e-6)
    (g,) = torch.autograd.grad(loss, v_th)
    assert float(g) == pytest.approx(-2.5, rel=1e-5)
    # without the adaptive weighting: (0.75*0.16 + 0.25*0.36) / 0.1 * 5 = 10.5
    assert float(m["policy_loss_plain_mse"]) == pytest.approx(10.5, rel=1e-6)
    # one name, one meaning: `unweighted_policy_loss` is only the logged official ori_policy_loss.mean() = policy / 5
    # = 4.5 (bug caught: nft_loss named the plain MSE 10.5 `unweighted_policy_loss` while the log used the name
    # for 4.5)
    from rewardkit.rl.tracking import loss_terms

    assert "unweighted_policy_loss" not in m
    logged = loss_terms(v_th, v_old, None, x0, loss, m, 5.0)
    assert logged["unweighted_policy_loss"] == pytest.approx(4.5, rel=1e-6)
    assert logged["policy_loss_plain_mse"] == pytest.approx(10.5, rel=1e-6)


def test_nft_loss_mask_by_hand():
    """Two samples, mask [1, 0]: sample 0 is the beta = 0.1 case above (22.5); sample 1 (x0 = 0, xt = 1, t = 1,
    v_old = v_theta = 0, r NaN: an unscored sample) would add L = 1 per side. Means divide by B = 2:
    policy = (22.5 + 0) / 2 = 11.25; KL with v_ref = [2, 5]: (1*(3-2)^2 + 0*(0-5)^2) / 2 = 0.5;
    loss = 11.25 + 0.1 * 0.5 = 11.3. Without the mask (r = 0.2 for sample 1): sample 1 adds
    (0.2*1 + 0.8*1) / 0.1 * 5 = 50, policy (22.5 + 50) / 2 = 36.25."""
    # Bug caught (issue 25 mutation survivor): ignoring `mask` passed, no test passed one.
    x0 = torch.zeros(2, 1, 1, 1)
    xt = torch.ones(2, 1, 1, 1)
    t = torch.tensor([0.5, 1.0])
    v_old = torch.tensor([1.0, 0.0]).view(2, 1, 1, 1)
    v_th = torch.tensor([3.0, 0.0]).view(2, 1, 1, 1).requires_grad_(True)
    v_ref = torch.tensor([2.0, 5.0]).view(2, 1, 1, 1)
    r = torch.tensor([0.75, float("nan")])
    loss, m = nft.nft_loss(v_th, v_old, v_ref, x0, xt, t, r, beta=0.1, kl_coef=0.1, mask=torch.tensor([1.0, 0.0]))
    assert float(m["policy_loss"]) == pytest.approx(11.25, rel=1e-6)
    assert float(m["kl"]) == pytest.approx(0.5, rel=1e-6)
    assert float(loss) == pytest.approx(11.3, rel=1e-6)
    (g,) = torch.autograd.grad(loss, v_th)
    # sample 0: policy -2.5 / 2, KL 0.1 * 2*(3-2) / 2 = 0.1; sample 1: nothing
    assert g.flatten().tolist() == pytest.approx([-1.25 + 0.1, 0.0], abs=1e-6)
    full, _ = nft.nft_loss(v_th, v_old, None, x0, xt, t, torch.tensor([0.75, 0.2]), beta=0.1)
    assert float(full) == pytest.approx(36.25, rel=1e-6)


# ------------------------------------------------------------------------------------------ soft update / EMA
def test_soft_update_and_ema_arithmetic():
    old = [torch.tensor([1.0, 2.0])]
    cur = [torch.tensor([3.0, 6.0])]
    nft.soft_update_(old, cur, 0.25)
    assert old[0].tolist() == [2.5, 5.0]
    nft.soft_update_(old, cur, 0.0)
    assert old[0].tolist() == [3.0, 6.0]
    ema = [torch.tensor([0.0])]
    d = nft.ema_update_(ema, [torch.tensor([11.0])], step=1)
    assert d == pytest.approx(2 / 11) and float(ema[0]) == pytest.approx(9.0)
    with pytest.raises(ValueError):
        nft.soft_update_(old, cur, 1.5)


# ------------------------------------------------------------------------------------------ E²PO
def test_content_token_mask_clip_pads_with_eos():
    ids = torch.tensor([[0, 7, 8, 9, 1, 1, 1], [0, 5, 1, 1, 1, 1, 1], [0, 4, 4, 4, 4, 4, 4]])
    m = X.content_token_mask(ids, eos_token_id=1, bos_token_id=0)
    assert m.tolist() == [[False, True, True, True, False, False, False],
                          [False, True, False, False, False, False, False],
                          [False, True, True, True, True, True, True]]
    t5 = torch.tensor([[5, 6, 1, 0, 0]])  # no BOS; pad 0 after EOS 1
    assert X.content_token_mask(t5, eos_token_id=1).tolist() == [[True, True, False, False, False]]


def test_e2po_losses_by_hand():
    e = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    c = 1 / math.sqrt(2)
    # ordered pairs: (0,1)=0, (0,2)=c, (1,2)=c, twice each, over 3*2 pairs
    assert float(X.diversity_loss(e)) == pytest.approx(4 * c / 6)
    assert float(X.diversity_loss(e[:1])) == 0.0
    anc = torch.tensor([1.0, 0.0])
    assert X.anchor_similarity(e, anc).tolist() == pytest.approx([1.0, 0.0, c])
    want = max(abs(1 - 0.8) - 0.01, 0) + max(abs(0 - 0.8) - 0.01, 0) + max(abs(c - 0.8) - 0.01, 0)
    assert float(X.anchor_loss(e, anc, 0.8, 0.01)) == pytest.approx(want)
    e2 = torch.tensor([[0.8, 0.6]])  # cos = 0.8 exactly: inside the margin
    assert float(X.anchor_loss(e2, anc, 0.8, 0.01)) == 0.0
    # batched over prompts: [P, V, D]
    eb = torch.stack([e, e.flip(0)])
    assert X.diversity_loss(eb).tolist() == pytest.approx([4 * c / 6] * 2)


def test_gamma_and_noise_aware_condition():
    g = X.noise_aware_gamma(torch.tensor([1.0, 0.9, 0.8, 0.6, 0.5, 0.0], dtype=torch.float64), rho=0.4)
    assert g.tolist() == pytest.approx([1.0, 0.75, 0.5, 0.0, 0.0, 0.0])
    c0, c1 = torch.zeros(2, 3), torch.ones(2, 3)
    assert X.noise_aware_condition(c0, c1, 0.9, 0.4).tolist() == [[0.75] * 3] * 2
    out = X.noise_aware_condition(c0, c1, torch.tensor([1.0, 0.5]), 0.4)
    assert out.tolist() == [[1.0] * 3, [0.0] * 3]
    assert float(X.noise_aware_gamma(0.5, rho=1.0)) == 0.5


def test_anchor_band_warning():
    cfg = X.E2POConfig()
    assert X.check_anchor_band(0.85, cfg)
    with pytest.warns(UserWarning, match="outside"):
        assert not X.check_anchor_band(0.2, cfg)
    with pytest.warns(UserWarning):
        assert not X.check_anchor_band(float("nan"), cfg)


@pytest.mark.parametrize("field, value, message", [
    ("num_variants", 1, r"e2po.num_variants \(K\) must be >= 2, got 1"),
    ("steps", -1, r"e2po.steps >= 0, e2po.lr > 0, e2po.sigma_init >= 0 and e2po.delta_max > 0 required"),
    ("lr", 0.0, r"e2po.lr > 0"),
    ("sigma_init", -1e-9, r"e2po.sigma_init >= 0"),
    ("sigma_init", float("nan"), r"e2po.sigma_init >= 0"),
    ("delta_max", 0.0, r"e2po.delta_max > 0"),
    ("rho", 0.0, r"e2po.rho must be in \(0, 1\], got 0.0"),
    ("rho", 1.5, r"e2po.rho must be in \(0, 1\], got 1.5"),
    ("mu", 1.01, r"e2po.mu must be a cosine in \[-1, 1\] and eps >= 0, got 1.01, 0.01"),
    ("mu", -1.01, r"e2po.mu must be a cosine"),
    ("eps", -0.001, r"and eps >= 0, got 0.8, -0.001"),
    ("encoders", ["t5"], r"e2po.encoders must be a non-empty subset of \[clip_l, clip_g\], got \['t5'\]"),
    ("encoders", [], r"e2po.encoders must be a non-empty subset of \[clip_l, clip_g\], got \[\]"),
])
def test_e2po_config_refuses_each_bad_knob(field, value, message):
    # catches a widened bound (rho = 0 accepted: gamma would divide by 0) or an error without its message
    with pytest.raises(ValueError, match=message):
        X.E2POConfig(**{field: value}).validate()


def test_e2po_config_accepts_each_bound():
    # catches a narrowed bound: every edge of the documented ranges is valid
    for kw in ({"num_variants": 2}, {"steps": 0}, {"sigma_init": 0.0}, {"rho": 1.0}, {"rho": 1e-6}, {"mu": 1.0},
               {"mu": -1.0}, {"eps": 0.0}, {"encoders": ["clip_l", "clip_g"]}, {"encoders": ["clip_g"]}):
        X.E2POConfig(**kw).validate()
