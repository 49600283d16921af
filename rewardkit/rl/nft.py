"""DiffusionNFT's math as pure functions: rewards -> advantages -> optimality probability, the NFT loss,
and the parameter arithmetic of the old policy and the EMA.

References: Zheng et al., "DiffusionNFT: Online Diffusion Reinforcement with Forward Process" (2025), and
the numerics of its official code (group mean per prompt, one global standard deviation, clip at 5, the
self-normalised x0-space loss, a KL term to the base model).
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["group_advantages", "optimality_probability", "zero_std_group_ratio", "nft_loss",
           "soft_update_", "ema_update_", "ADV_MODES"]

ADV_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, *, global_std: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """``A = (R - mean of R over the sample's group) / (std + eps)``.

    Args:
        rewards: ``[N]`` rewards of every sample of the epoch (all ranks). NaN marks an unscored sample: it is
            left out of every statistic and gets a NaN advantage.
        groups: ``[N]`` int group id (the prompt index; samples of one prompt form a group).
        global_std: one standard deviation over all valid rewards (DiffusionNFT's default) or one per group.
        eps: added to the standard deviation (outside the square root). Population std (ddof = 0).

    Returns:
        float64 ``[N]``.
    """
    r = rewards.detach().double().reshape(-1)
    g = groups.reshape(-1).to(r.device)
    if r.shape != g.shape:
        raise ValueError(f"rewards {tuple(r.shape)} and groups {tuple(g.shape)} differ")
    ok = torch.isfinite(r)
    adv = torch.full_like(r, float("nan"))
    if not bool(ok.any()):
        return adv
    std_all = r[ok].std(unbiased=False) if int(ok.sum()) > 1 else r.new_zeros(())
    for gid in torch.unique(g[ok]).tolist():
        m = ok & (g == gid)
        mean = r[m].mean()
        std = std_all if global_std else (r[m].std(unbiased=False) if int(m.sum()) > 1 else r.new_zeros(()))
        adv[m] = (r[m] - mean) / (std + eps)
    return adv


def optimality_probability(adv: torch.Tensor, clip_max: float = 5.0, mode: str = "all") -> torch.Tensor:
    """``r = clamp(clip(A, -c, c) / c / 2 + 1/2, 0, 1)`` in [0, 1]: DiffusionNFT's optimality probability
    (``r = 1/2 + 1/2 clip((R - E[R|c]) / Z_c, -1, 1)`` with ``Z_c = c * std``). NaN stays NaN.

    ``mode`` (the official ``train.adv_mode``, scripts/train_nft_sd3.py:915-925 of NVlabs/DiffusionNFT):
    ``all`` (default), ``positive_only`` (A < 0 -> 0, i.e. r >= 1/2), ``negative_only`` (A > 0 -> 0,
    r <= 1/2), ``one_only`` (A -> 1 where A > 0, else 0: r = 1/2 + 1/(2c) or 1/2) or ``binary``
    (A -> sign(A): r = 1/2 - 1/(2c), 1/2 or 1/2 + 1/(2c)). The clip to [-c, c] comes first, as there.
    """
    if not clip_max > 0:
        raise ValueError(f"clip_max must be > 0, got {clip_max}")
    if mode not in ADV_MODES:
        raise ValueError(f"adv mode must be one of {ADV_MODES}, got {mode!r}")
    a = adv.clamp(-clip_max, clip_max)
    if mode == "positive_only":
        a = a.clamp(min=0)
    elif mode == "negative_only":
        a = a.clamp(max=0)
    elif mode == "one_only":
        a = torch.where(a > 0, torch.ones_like(a), torch.where(torch.isnan(a), a, torch.zeros_like(a)))
    elif mode == "binary":
        a = torch.where(torch.isnan(a), a, torch.sign(a))   # torch.sign(NaN) is 0: keep an unscored sample NaN
    return (a / clip_max / 2 + 0.5).clamp(0, 1)


def zero_std_group_ratio(rewards: torch.Tensor, groups: torch.Tensor, tol: float = 0.0) -> float:
    """Fraction of groups (with >= 2 valid rewards) whose rewards are all equal (std <= tol): groups that
    carry no learning signal. NaN when no group qualifies."""
    r = rewards.detach().double().reshape(-1)
    g = groups.reshape(-1)
    ok = torch.isfinite(r)
    flat, total = 0, 0
    for gid in torch.unique(g[ok]).tolist():
        v = r[ok & (g == gid)]
        if v.numel() < 2:
            continue
        total += 1
        flat += int(float(v.std(unbiased=False)) <= tol)
    return flat / total if total else float("nan")


def _mean_chw(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1).mean(dim=1)


def nft_loss(v_theta: torch.Tensor, v_old: torch.Tensor, v_ref: torch.Tensor | None, x0: torch.Tensor,
             xt: torch.Tensor, t: torch.Tensor, r: torch.Tensor, *, beta: float = 1.0, adv_clip_max: float = 5.0,
             kl_coef: float = 1e-4, weight_floor: float = 1e-5, self_normalize: bool = True,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DiffusionNFT's loss for one micro-batch at one timestep per sample.

    Implicit policies ``v+ = beta v_theta + (1 - beta) v_old`` and ``v- = (1 + beta) v_old - beta v_theta``;
    x0 predictions ``x0(v) = xt - t v``; per sample
    ``L(v) = mean_CHW (x0(v) - x0)^2 / sg(max(mean_CHW |x0(v) - x0|, floor))`` (``self_normalize``; the
    normaliser in float64), ``policy = mean_B (r L(v+) + (1 - r) L(v-)) / beta * adv_clip_max``,
    ``kl = mean_B mean_CHW (v_theta - v_ref)^2`` and ``loss = policy + kl_coef * kl``. The arithmetic runs in
    float32 (bf16 / fp16 inputs are upcast), or in float64 when any input is float64 (for checking).

    Args:
        v_theta: ``[B, C, H, W]`` prediction of the trained adapter (with grad).
        v_old: ``[B, C, H, W]`` prediction of the old (rollout) adapter; detached here.
        v_ref: ``[B, C, H, W]`` prediction of the base model (adapters off), or None for no KL term.
        x0: ``[B, C, H, W]`` clean latents (the rollout's final latents).
        xt: ``[B, C, H, W]`` ``(1 - t) x0 + t eps``.
        t: ``[B]`` noise levels in (0, 1].
        r: ``[B]`` optimality probabilities in [0, 1].
        mask: optional ``[B]`` 0/1 sample weights (0 for a sample without a valid reward; the mean still
            divides by B, so every process does the same amount of work and scale).

    Returns:
        ``(loss, metrics)``: a scalar and detached diagnostics (``policy_loss`` without the KL term,
        ``policy_loss_plain_mse``: the same without the adaptive x0 weighting, ``kl``, ``old_deviation``,
        ``x0_norm``; the logged ``unweighted_policy_loss`` is another quantity, :func:`.tracking.loss_terms`).
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    b = v_theta.shape[0]
    if not (v_old.shape == x0.shape == xt.shape == v_theta.shape) or t.shape != (b,) or r.shape != (b,):
        raise ValueError(f"shape mismatch: v_theta {tuple(v_theta.shape)}, v_old {tuple(v_old.shape)}, "
                         f"x0 {tuple(x0.shape)}, xt {tuple(xt.shape)}, t {tuple(t.shape)}, r {tuple(r.shape)}")
    # float32 arithmetic for low-precision inputs (the official code's promotion); float64 stays float64
    dt = torch.float64 if any(x is not None and x.dtype == torch.float64 for x in (v_theta, v_old, v_ref, x0, xt, t)) \
        else torch.float32
    v_old = v_old.detach().to(dt)
    v_theta = v_theta.to(dt)
    x0, xt = x0.to(dt), xt.to(dt)
    tt = t.to(dt).reshape(b, *([1] * (v_theta.ndim - 1)))
    v_pos = beta * v_theta + (1 - beta) * v_old
    v_neg = (1 + beta) * v_old - beta * v_theta
    err_pos = xt - tt * v_pos - x0
    err_neg = xt - tt * v_neg - x0
    if self_normalize:
        with torch.no_grad():
            w_pos = _mean_chw(err_pos.double().abs()).clamp(min=weight_floor)
            w_neg = _mean_chw(err_neg.double().abs()).clamp(min=weight_floor)
    else:
        w_pos = w_neg = torch.ones(b, dtype=torch.float64, device=v_theta.device)
    l_pos = _mean_chw(err_pos ** 2) / w_pos
    l_neg = _mean_chw(err_neg ** 2) / w_neg
    w = torch.ones(b, dtype=torch.float64, device=v_theta.device) if mask is None else mask.to(torch.float64)
    rr = torch.where(w > 0, r.to(l_pos.dtype), torch.full_like(r, 0.5, dtype=l_pos.dtype))  # NaN-free
    policy = (w * (rr * l_pos + (1 - rr) * l_neg) / beta).mean() * adv_clip_max
    loss = policy
    kl = torch.zeros((), dtype=torch.float64, device=v_theta.device)
    if v_ref is not None:
        kl = (w * _mean_chw((v_theta - v_ref.detach().to(dt)) ** 2)).mean()
        loss = policy + kl_coef * kl
    with torch.no_grad():
        plain = rr * _mean_chw(err_pos ** 2) + (1 - rr) * _mean_chw(err_neg ** 2)
        plain_mse = (w * plain / beta).mean() * adv_clip_max
        metrics = {"policy_loss": policy.detach(), "policy_loss_plain_mse": plain_mse, "kl": kl.detach(),
                   "old_deviation": _mean_chw((v_theta.detach() - v_old) ** 2).mean(),
                   "x0_norm": _mean_chw(x0 ** 2).mean()}
    return loss, metrics


@torch.no_grad()
def soft_update_(target: Iterable[torch.Tensor], source: Iterable[torch.Tensor], decay: float) -> None:
    """In place, ``target <- decay * target + (1 - decay) * source`` (the old-policy update; the EMA step)."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got {decay}")
    tgt, src = list(target), list(source)
    if len(tgt) != len(src):
        raise ValueError(f"{len(tgt)} target tensors for {len(src)} source tensors")
    for a, b in zip(tgt, src):
        if a.shape != b.shape:
            raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
        a.mul_(decay).add_(b.detach().to(a.dtype), alpha=1 - decay)


def ema_update_(ema: Iterable[torch.Tensor], params: Iterable[torch.Tensor], step: int, max_decay: float = 0.9) -> float:
    """One EMA step with the effective decay ``min((1 + step) / (10 + step), max_decay)``; returns the decay."""
    from .schedule import ema_decay

    d = ema_decay(step, max_decay)
    soft_update_(ema, params, d)
    return d
