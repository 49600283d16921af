"""nft_loss keeps float64 inputs in float64 (a checking path): values against an independent numpy float64
transcription of the official loss (reference: DiffusionNFT scripts/train_nft_sd3.py loss block, as summarised
in docs/rl.md), and torch.autograd.gradcheck, which float32 arithmetic fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rewardkit.rl.nft import nft_loss


def _inputs(seed=0, b=3, shape=(2, 3, 3)):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(b, *shape, generator=g, dtype=torch.float64)
    eps = torch.randn(b, *shape, generator=g, dtype=torch.float64)
    t = torch.tensor([0.2, 0.55, 0.9], dtype=torch.float64)[:b]
    xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    v_old = eps - x0 + 1e-3 * torch.randn(b, *shape, generator=g, dtype=torch.float64)
    v_theta = v_old + 1e-9 * torch.randn(b, *shape, generator=g, dtype=torch.float64)  # below float32 resolution
    v_ref = v_old + 1e-2 * torch.randn(b, *shape, generator=g, dtype=torch.float64)
    r = torch.tensor([0.1, 0.5, 0.95], dtype=torch.float64)[:b]
    return v_theta, v_old, v_ref, x0, xt, t, r


def _numpy_reference(v_theta, v_old, v_ref, x0, xt, t, r, beta=1.0, clip=5.0, kl_coef=1e-4, floor=1e-5):
    vt, vo, vr, x0, xt, t, r = (np.asarray(a, dtype=np.float64) for a in (v_theta, v_old, v_ref, x0, xt, t, r))
    tt = t.reshape(-1, 1, 1, 1)
    vp = beta * vt + (1 - beta) * vo
    vn = (1 + beta) * vo - beta * vt
    ep, en = xt - tt * vp - x0, xt - tt * vn - x0
    wp = np.maximum(np.abs(ep).reshape(len(t), -1).mean(1), floor)
    wn = np.maximum(np.abs(en).reshape(len(t), -1).mean(1), floor)
    lp = (ep ** 2).reshape(len(t), -1).mean(1) / wp
    ln = (en ** 2).reshape(len(t), -1).mean(1) / wn
    policy = (r * lp / beta + (1 - r) * ln / beta).mean() * clip
    kl = ((vt - vr) ** 2).reshape(len(t), -1).mean(1).mean()
    return policy + kl_coef * kl, policy


def test_nft_loss_float64_matches_numpy_float64_reference():
    inp = _inputs()
    loss, m = nft_loss(*inp)
    ref_loss, ref_policy = _numpy_reference(*(a.detach().numpy() for a in inp))
    assert loss.dtype == torch.float64
    # float32 arithmetic is off by ~1e-7 relative here; float64 agrees to ~1e-15
    assert float(loss) == pytest.approx(ref_loss, rel=1e-12, abs=0)
    assert float(m["policy_loss"]) == pytest.approx(ref_policy, rel=1e-12, abs=0)
    # the perturbation of v_theta (1e-9) is visible in float64: old_deviation is ~1e-18, not 0
    assert 0 < float(m["old_deviation"]) < 1e-16


def test_nft_loss_float64_passes_gradcheck():
    v_theta, v_old, v_ref, x0, xt, t, r = _inputs()
    v_theta = v_theta.clone().requires_grad_(True)

    def f(v):  # without the detached self-normalisation, the loss is a smooth function of v_theta
        return nft_loss(v, v_old, v_ref, x0, xt, t, r, self_normalize=False)[0]

    assert torch.autograd.gradcheck(f, (v_theta,), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_nft_loss_low_precision_inputs_still_computed_in_float32():
    v_theta, v_old, v_ref, x0, xt, t, r = (a.to(torch.bfloat16) for a in _inputs())
    loss, _ = nft_loss(v_theta, v_old, v_ref, x0, xt, t, r.float())
    ref_loss, _ = _numpy_reference(*(a.float().numpy() for a in (v_theta, v_old, v_ref, x0, xt, t, r)))
    assert torch.isfinite(loss) and float(loss) == pytest.approx(ref_loss, rel=1e-5)


def test_nft_loss_float32_inputs_use_float32_arithmetic():
    # catches float64 arithmetic for float32 inputs (`is not None or ...`): with xt = x0 = 2**24, t = 1 and
    # v = 0.5, x0(v) - x0 = 2**24 - 0.5 - 2**24 rounds to 0 in float32 (half-way, to even) but is -0.5 in
    # float64, where L = 0.25 / 0.5 = 0.5 and the policy loss 0.5 * 5 = 2.5 (beta 1, r = 0.5, no KL term)
    def loss(dtype):
        v = torch.full((1, 1, 1, 1), 0.5, dtype=dtype)
        x = torch.full((1, 1, 1, 1), 2.0 ** 24, dtype=dtype)
        out, _ = nft_loss(v, v, None, x, x, torch.ones(1, dtype=dtype), torch.full((1,), 0.5, dtype=dtype))
        return float(out)

    assert loss(torch.float32) == 0.0
    assert loss(torch.float64) == 2.5
