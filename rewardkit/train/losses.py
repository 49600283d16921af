"""Preference losses and metrics as pure functions (no state, no I/O).

Conventions: ``r_a``, ``r_b`` are float tensors ``[B]`` of rewards for the two candidates of each pair;
``labels`` is a long tensor ``[B]`` with ``LABEL_A`` (a preferred), ``LABEL_B`` (b preferred) or ``LABEL_TIE``.
Every loss returns a scalar: the (optionally weighted) mean of the per-pair losses.

- Bradley–Terry: ``P(w > l) = sigmoid(r_w - r_l)``; loss ``-log sigmoid(r_w - r_l - margin)``; the optional
  reward-centering term ``c * mean((r_w + r_l)^2)`` keeps rewards near zero (Eisenstein et al. 2023; TRL's
  ``center_rewards_coefficient``).
- Rao–Kupper ties (theta > 1): ``P(a > b) = e^ra / (e^ra + theta e^rb)``,
  ``P(tie) = (theta^2 - 1) e^ra e^rb / ((e^ra + theta e^rb)(e^rb + theta e^ra))``.
- Davidson ties (nu > 0): ``P(a > b) = e^ra / (e^ra + e^rb + nu sqrt(e^ra e^rb))``,
  ``P(tie) = nu sqrt(e^ra e^rb) / (same denominator)``.
- Uncertainty (each reward is Gaussian, ``N(mu, sigma^2)``), two forms that differ in value and in the
  gradient they give ``sigma``:

  * ``"hpsv3"`` (HPSv3's objective): ``E_z[-log sigmoid(z)]`` with ``z ~ N(mu_w - mu_l - margin,
    sigma_w^2 + sigma_l^2)``, estimated by Monte Carlo with the reparameterisation
    ``z = mu_w - mu_l - margin + sqrt(sigma_w^2 + sigma_l^2) * eps`` (``eps`` from a seeded generator, so a
    given seed gives bitwise the same loss). ``-log sigmoid`` is convex, so by Jensen a larger sigma always
    raises this loss: a model cannot buy down a misranked pair by declaring itself uncertain.
  * ``"probit"`` (Thurstone): ``P(w > l) = Phi((mu_w - mu_l - margin) / sqrt(sigma_w^2 + sigma_l^2))``, loss
    ``-log Phi(...)``. Deterministic, but on a misranked pair (negative gap) inflating sigma moves the argument
    toward 0 and *lowers* the loss. It is not the closed form of HPSv3's objective (that expectation has no
    closed form).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "LABEL_A", "LABEL_B", "LABEL_TIE",
    "bradley_terry_loss", "rao_kupper_loss", "rao_kupper_probs", "davidson_loss", "davidson_probs", "uncertainty_loss",
    "uncertainty_hpsv3_loss", "uncertainty_probit_loss", "UNCERTAINTY_FORMS",
    "winner_loser", "pairwise_accuracy", "reward_stats", "lr_at",
]

LABEL_A, LABEL_B, LABEL_TIE = 0, 1, 2


def _weighted_mean(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    if weight is None:
        return x.mean()
    w = weight.to(x.dtype)
    return (x * w).sum() / w.sum().clamp_min(torch.finfo(x.dtype).tiny)


def winner_loser(r_a: torch.Tensor, r_b: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reorder ``[B]`` rewards into (winner, loser) by ``labels`` (ties must be filtered out first)."""
    if bool((labels == LABEL_TIE).any()):
        raise ValueError("winner_loser got tie labels; drop ties or use a tie-aware loss")
    a_wins = labels == LABEL_A
    return torch.where(a_wins, r_a, r_b), torch.where(a_wins, r_b, r_a)


def bradley_terry_loss(r_w: torch.Tensor, r_l: torch.Tensor, *, margin: torch.Tensor | float | None = None,
                       weight: torch.Tensor | None = None, center_coef: float = 0.0) -> torch.Tensor:
    """``mean(-log sigmoid(r_w - r_l - margin)) + center_coef * mean((r_w + r_l)^2)``.

    Args:
        r_w, r_l: ``[B]`` rewards of the preferred and the rejected candidate.
        margin: ``[B]`` or scalar required reward gap (0 when None).
        weight: ``[B]`` per-pair weights (weighted mean), or None.
        center_coef: coefficient of the reward-centering term.
    """
    diff = r_w - r_l
    if margin is not None:
        diff = diff - torch.as_tensor(margin, dtype=diff.dtype, device=diff.device)
    loss = _weighted_mean(-F.logsigmoid(diff), weight)
    if center_coef:
        loss = loss + center_coef * _weighted_mean((r_w + r_l) ** 2, weight)
    return loss


def _tie_nll(logp_a: torch.Tensor, logp_b: torch.Tensor, logp_tie: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logp = torch.stack([logp_a, logp_b, logp_tie], dim=-1)  # [B, 3] in label order
    return -logp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)


def rao_kupper_probs(r_a: torch.Tensor, r_b: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities ``(log P(a>b), log P(b>a), log P(tie))``, each ``[B]``, under Rao–Kupper."""
    if not theta > 1.0:
        raise ValueError(f"Rao-Kupper theta must be > 1, got {theta}")
    log_t = math.log(theta)
    d = r_a - r_b
    logp_a = F.logsigmoid(d - log_t)      # e^ra / (e^ra + theta e^rb)
    logp_b = F.logsigmoid(-d - log_t)
    # (t^2-1) e^ra e^rb / ((e^ra + t e^rb)(e^rb + t e^ra)) = (t^2-1) * P(a>b) * P(b>a)
    logp_tie = math.log(theta ** 2 - 1.0) + logp_a + logp_b
    return logp_a, logp_b, logp_tie


def rao_kupper_loss(r_a: torch.Tensor, r_b: torch.Tensor, labels: torch.Tensor, *, theta: float = 2.0,
                    weight: torch.Tensor | None = None) -> torch.Tensor:
    """Negative log-likelihood of A / B / tie outcomes under Rao–Kupper (``theta > 1`` widens ties)."""
    return _weighted_mean(_tie_nll(*rao_kupper_probs(r_a, r_b, theta), labels), weight)


def davidson_probs(r_a: torch.Tensor, r_b: torch.Tensor, nu: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities ``(log P(a>b), log P(b>a), log P(tie))``, each ``[B]``, under Davidson."""
    if not nu > 0.0:
        raise ValueError(f"Davidson nu must be > 0, got {nu}")
    half = (r_a - r_b) / 2
    # divide numerator and denominator by sqrt(e^ra e^rb): D = e^{d/2} + e^{-d/2} + nu
    log_den = torch.logsumexp(torch.stack([half, -half, torch.full_like(half, math.log(nu))]), dim=0)
    return half - log_den, -half - log_den, math.log(nu) - log_den


def davidson_loss(r_a: torch.Tensor, r_b: torch.Tensor, labels: torch.Tensor, *, nu: float = 1.0,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """Negative log-likelihood of A / B / tie outcomes under Davidson's tie model."""
    return _weighted_mean(_tie_nll(*davidson_probs(r_a, r_b, nu), labels), weight)


UNCERTAINTY_FORMS = ("hpsv3", "probit")


def _gap_and_scale(mu_w, log_sigma_w, mu_l, log_sigma_l, margin):
    diff = mu_w - mu_l
    if margin is not None:
        diff = diff - torch.as_tensor(margin, dtype=diff.dtype, device=diff.device)
    scale = torch.sqrt(torch.exp(2 * log_sigma_w) + torch.exp(2 * log_sigma_l))
    return diff, scale


def uncertainty_probit_loss(mu_w: torch.Tensor, log_sigma_w: torch.Tensor, mu_l: torch.Tensor,
                            log_sigma_l: torch.Tensor, *, margin: torch.Tensor | float | None = None,
                            weight: torch.Tensor | None = None) -> torch.Tensor:
    """``mean(-log Phi((mu_w - mu_l - margin) / sqrt(sigma_w^2 + sigma_l^2)))``; all inputs ``[B]``."""
    diff, scale = _gap_and_scale(mu_w, log_sigma_w, mu_l, log_sigma_l, margin)
    return _weighted_mean(-torch.special.log_ndtr(diff / scale), weight)


def uncertainty_hpsv3_loss(mu_w: torch.Tensor, log_sigma_w: torch.Tensor, mu_l: torch.Tensor,
                           log_sigma_l: torch.Tensor, *, margin: torch.Tensor | float | None = None,
                           weight: torch.Tensor | None = None, samples: int = 32, seed: int = 0) -> torch.Tensor:
    """HPSv3's objective: per pair, the mean over ``samples`` draws of ``-log sigmoid(z)``,
    ``z = mu_w - mu_l - margin + sqrt(sigma_w^2 + sigma_l^2) * eps``, ``eps ~ N(0, 1)`` ``[B, samples]`` drawn
    on the CPU from ``torch.Generator().manual_seed(seed)`` (same seed, same draws on any device); gradients
    reach ``mu`` and ``log_sigma`` through the reparameterisation. All inputs ``[B]``."""
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    diff, scale = _gap_and_scale(mu_w, log_sigma_w, mu_l, log_sigma_l, margin)
    g = torch.Generator().manual_seed(int(seed))
    eps = torch.randn((diff.shape[0], samples), generator=g, dtype=torch.float64)
    z = diff.unsqueeze(-1) + scale.unsqueeze(-1) * eps.to(device=diff.device, dtype=diff.dtype)  # [B, S]
    return _weighted_mean((-F.logsigmoid(z)).mean(-1), weight)


def uncertainty_loss(mu_w: torch.Tensor, log_sigma_w: torch.Tensor, mu_l: torch.Tensor, log_sigma_l: torch.Tensor,
                     *, margin: torch.Tensor | float | None = None, weight: torch.Tensor | None = None,
                     form: str = "hpsv3", samples: int = 32, seed: int = 0) -> torch.Tensor:
    """Gaussian-reward preference loss, ``form="hpsv3"`` (default: HPSv3's Monte-Carlo objective, see
    :func:`uncertainty_hpsv3_loss`) or ``"probit"`` (:func:`uncertainty_probit_loss`). All inputs ``[B]``.

    Why HPSv3 is the default: it is the objective the paper trains with, and it never rewards a model for
    inflating sigma on a pair it ranks wrongly, which the probit form does."""
    if form == "hpsv3":
        return uncertainty_hpsv3_loss(mu_w, log_sigma_w, mu_l, log_sigma_l, margin=margin, weight=weight,
                                      samples=samples, seed=seed)
    if form == "probit":
        return uncertainty_probit_loss(mu_w, log_sigma_w, mu_l, log_sigma_l, margin=margin, weight=weight)
    raise ValueError(f"uncertainty form must be one of {UNCERTAINTY_FORMS}, got {form!r}")


def pairwise_accuracy(r_a: torch.Tensor, r_b: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """Fraction of non-tie pairs ranked correctly (an exactly equal score counts as half); returns (acc, n)."""
    keep = labels != LABEL_TIE
    if not bool(keep.any()):
        return float("nan"), 0
    d = (r_a - r_b)[keep]
    sign = torch.where(labels[keep] == LABEL_A, d, -d)
    correct = (sign > 0).float() + 0.5 * (sign == 0).float()
    return float(correct.mean()), int(keep.sum())


def reward_stats(rewards: torch.Tensor) -> dict[str, float]:
    """Mean / std (population) / min / max of a ``[N]`` reward tensor."""
    r = rewards.detach().float()
    if r.numel() == 0:
        return {}
    return {"reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)),
            "reward_min": float(r.min()), "reward_max": float(r.max())}


def lr_at(step: int, *, base_lr: float, total_steps: int, warmup_steps: int = 0, schedule: str = "cosine",
          min_lr_ratio: float = 0.0) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine decay or constant.

    Cosine decays from ``base_lr`` at the end of warmup to ``min_lr_ratio * base_lr`` at ``total_steps``.
    """
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"unknown lr schedule {schedule!r}; use 'cosine' or 'constant'")
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return base_lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
