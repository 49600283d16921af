"""Noise schedules and the decay schedules of the old policy and the EMA (pure functions).

Conventions: ``sigma`` is the flow-matching noise level in [0, 1] (``x_sigma = (1 - sigma) x0 + sigma eps``);
the transformer is fed ``timestep = 1000 * sigma`` (a float, in sampling and in training alike).
"""

from __future__ import annotations

import math

import torch

__all__ = ["flow_sigmas", "train_timestep_indices", "num_train_timesteps", "old_policy_decay", "ema_decay",
           "DECAY_TYPES"]


def _shift(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * sigma / (1 + (shift - 1) * sigma)


def flow_sigmas(num_steps: int, shift: float = 3.0, num_train_timesteps: int = 1000) -> torch.Tensor:
    """SD3 / SD3.5's inference schedule, as ``FlowMatchEulerDiscreteScheduler(shift).set_timesteps(N)`` gives it.

    The scheduler's training sigmas ``k / T`` (k = 1..T) are shifted once (so its smallest sigma is
    ``shift(1/T)``), ``N`` values are spaced linearly between the largest and the smallest, shifted a second
    time, and 0 is appended.

    Returns:
        float64 tensor ``[N + 1]``, decreasing from 1 to 0. For N = 10, shift 3:
        ``[1.0, 0.9601, 0.9133, 0.8577, 0.7904, 0.7073, 0.6022, 0.4649, 0.278, 0.0089, 0.0]``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if not shift > 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    sigma_min = float(_shift(torch.tensor(1.0 / num_train_timesteps, dtype=torch.float64), shift))
    base = torch.linspace(1.0, sigma_min, num_steps, dtype=torch.float64)
    return torch.cat([_shift(base, shift), torch.zeros(1, dtype=torch.float64)])


def num_train_timesteps(num_steps: int, timestep_fraction: float) -> int:
    """How many of a rollout's ``num_steps`` timesteps each sample trains on: ``int(N * fraction)`` (>= 1)."""
    if not 0 < timestep_fraction <= 1:
        raise ValueError(f"timestep_fraction must be in (0, 1], got {timestep_fraction}")
    return max(1, int(num_steps * timestep_fraction))


def train_timestep_indices(batch: int, num_steps: int, num_train: int,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """Per sample, an independent random permutation of the rollout's step indices, cut to ``num_train``.

    Returns:
        long tensor ``[batch, num_train]`` of indices into ``flow_sigmas(num_steps)[:-1]`` (never the final 0).
    """
    if not 1 <= num_train <= num_steps:
        raise ValueError(f"num_train must be in [1, {num_steps}], got {num_train}")
    return torch.stack([torch.randperm(num_steps, generator=generator)[:num_train] for _ in range(batch)]) \
        if batch else torch.zeros(0, num_train, dtype=torch.long)


DECAY_TYPES = ("copy", "linear_to_0_5", "delayed_linear_to_0_999")


def old_policy_decay(step: int, decay_type: str | int = "linear_to_0_5") -> float:
    """Decay ``d`` of the soft update ``old <- d * old + (1 - d) * current`` after ``step`` optimizer steps.

    ``copy`` (official type 0): 0, a hard copy. ``linear_to_0_5`` (type 1, the default):
    ``min(0.001 * step, 0.5)``. ``delayed_linear_to_0_999`` (type 2, the OCR preset): 0 before step 75,
    then ``min(0.0075 * (step - 75), 0.999)``.
    """
    kind = {0: "copy", 1: "linear_to_0_5", 2: "delayed_linear_to_0_999"}.get(decay_type, decay_type)  # type: ignore[arg-type]
    if kind == "copy":
        return 0.0
    if kind == "linear_to_0_5":
        return min(0.001 * step, 0.5)
    if kind == "delayed_linear_to_0_999":
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    raise ValueError(f"decay_type must be one of {DECAY_TYPES} (or 0 / 1 / 2), got {decay_type!r}")


def ema_decay(step: int, max_decay: float = 0.9) -> float:
    """Effective EMA decay after ``step`` optimizer steps (the first update uses step 1):
    ``min((1 + step) / (10 + step), max_decay)``."""
    if step < 0 or not math.isfinite(max_decay):
        raise ValueError(f"bad EMA step {step} / decay {max_decay}")
    return min((1 + step) / (10 + step), max_decay)
