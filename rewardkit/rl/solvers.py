"""Rollout solvers for flow-matching models, as pure functions of a velocity function.

``velocity(x, sigma, i) -> v`` predicts ``v = eps - x0`` at noise level ``sigma`` (a Python float; ``i`` is the
step index, for callers whose conditioning changes along the trajectory, e.g. E²PO's noise-aware schedule).
``sigmas`` is a decreasing schedule ending at 0 (:func:`rewardkit.rl.schedule.flow_sigmas`). The state is
updated in float32 whatever the model's dtype.

- :func:`euler_ode`: ``x <- x + (sigma' - sigma) v`` (DiffusionNFT's evaluation sampler).
- :func:`flow_sde`: Flow-GRPO's SDE with noise level ``eta`` (``eta = 0`` is exactly :func:`euler_ode`).
- :func:`dpm2`: deterministic second-order multistep DPM-Solver++ in data prediction (DiffusionNFT's
  training rollouts); the first and the last steps are first order (DDIM), which at ``sigma' = 0`` returns
  the data prediction itself.
- :func:`ddim`: DiffusionNFT's ``ddim`` solver (``ddim_step`` / ``ddim_update`` of its
  ``flow_grpo/diffusers_patch/solver.py``): ``eta = 0`` (``"ddim"``, the official ``deterministic=True``) is
  exactly an Euler step for a flow-matching model; ``eta > 0`` (``"ddim_sde"``) adds DDIM's noise.

The stochastic solvers take ``generator``: one ``torch.Generator`` for the whole batch (each step draws the
batch's noise from it, so a sample's noise depends on the batch it is in), or a sequence of them, one per row
of ``x`` (row ``i``'s noise from generator ``i``: a sample gets the same noise whatever batch it is in).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

__all__ = ["euler_ode", "flow_sde", "dpm2", "ddim", "sample", "SOLVERS"]

VelocityFn = Callable[[torch.Tensor, float, int], torch.Tensor]
Generators = torch.Generator | Sequence[torch.Generator] | None


def _sig(sigmas: Sequence[float] | torch.Tensor) -> list[float]:
    s = [float(v) for v in (sigmas.tolist() if isinstance(sigmas, torch.Tensor) else sigmas)]
    if len(s) < 2 or any(not math.isfinite(v) for v in s) or any(b >= a for a, b in zip(s, s[1:])):
        raise ValueError(f"sigmas must be a finite, strictly decreasing list of >= 2 values, got {s}")
    return s


def euler_ode(velocity: VelocityFn, x: torch.Tensor, sigmas) -> torch.Tensor:
    """Euler steps of the probability-flow ODE. x: ``[B, C, H, W]`` noise at ``sigmas[0]``; returns x at the end."""
    s = _sig(sigmas)
    x = x.float()
    for i in range(len(s) - 1):
        x = x + (s[i + 1] - s[i]) * velocity(x, s[i], i).float()
    return x


def flow_sde(velocity: VelocityFn, x: torch.Tensor, sigmas, eta: float = 0.7,
             generator: Generators = None) -> torch.Tensor:
    """Flow-GRPO's SDE sampler: per step, with ``dt = sigma' - sigma < 0`` and
    ``std = eta * sqrt(sigma / (1 - sigma))`` (at sigma = 1 the denominator uses ``1 - sigmas[1]``),
    ``mean = x (1 + std^2 dt / (2 sigma)) + v (1 + std^2 (1 - sigma) / (2 sigma)) dt``,
    ``x' = mean + std sqrt(-dt) z``. ``eta = 0`` is :func:`euler_ode`."""
    s = _sig(sigmas)
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    x = x.float()
    for i in range(len(s) - 1):
        sig, dt = s[i], s[i + 1] - s[i]
        v = velocity(x, sig, i).float()
        denom = 1 - (s[1] if sig >= 1 else sig)
        std = eta * math.sqrt(sig / denom) if eta > 0 else 0.0
        mean = x * (1 + std ** 2 / (2 * sig) * dt) + v * (1 + std ** 2 * (1 - sig) / (2 * sig)) * dt
        if std > 0:
            mean = mean + std * math.sqrt(-dt) * _randn(x, generator)
        x = mean
    return x


def _lam(sigma: float) -> float:
    """log-SNR ``log((1 - sigma) / sigma)``; -inf at sigma = 1, +inf at sigma = 0."""
    if sigma >= 1:
        return -math.inf
    if sigma <= 0:
        return math.inf
    return math.log((1 - sigma) / sigma)


def dpm2(velocity: VelocityFn, x: torch.Tensor, sigmas) -> torch.Tensor:
    """Deterministic DPM-Solver++(2M) with data prediction ``x0 = x - sigma v``.

    Step ``sigma -> sigma'`` (``alpha = 1 - sigma``, ``h = lambda' - lambda``):
    first order ``x' = (sigma'/sigma) x + (alpha' - alpha sigma'/sigma) x0``; second order adds
    ``0.5 (alpha' - alpha sigma'/sigma) D1`` with ``D1 = (x0 - x0_prev) / r``, ``r = h_prev / h``. The first step
    (no previous prediction) and the last step (sigma' = 0, where it returns ``x0``) are first order. A
    previous step from sigma = 1 has ``h_prev = inf``, hence ``D1 = 0``: the second step is also first order.
    """
    s = _sig(sigmas)
    x = x.float()
    prev_x0, prev_h = None, None
    n = len(s) - 1
    for i in range(n):
        sig, nxt = s[i], s[i + 1]
        x0 = x - sig * velocity(x, sig, i).float()
        if nxt <= 0:
            x = x0
            break
        ratio = nxt / sig
        coef = (1 - nxt) - (1 - sig) * ratio
        h = _lam(nxt) - _lam(sig)
        out = ratio * x + coef * x0
        if prev_x0 is not None and i < n - 1 and math.isfinite(prev_h):
            r = prev_h / h
            out = out + 0.5 * coef * (x0 - prev_x0) / r
        x, prev_x0, prev_h = out, x0, h
    return x


def _randn(x: torch.Tensor, generator: Generators) -> torch.Tensor:
    """Standard normal noise shaped like ``x``, from ``generator`` (see the module doc: one for the batch, or one
    per row), drawn on the generator's device and moved to ``x``'s."""
    if generator is None or isinstance(generator, torch.Generator):
        if generator is None or generator.device == x.device:
            return torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        return torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)
    gens = list(generator)
    if len(gens) != x.shape[0]:
        raise ValueError(f"one generator per row: got {len(gens)} generators for {x.shape[0]} rows")
    return torch.cat([_randn(x[i:i + 1], g) for i, g in enumerate(gens)])


def ddim(velocity: VelocityFn, x: torch.Tensor, sigmas, eta: float = 0.0,
         generator: Generators = None) -> torch.Tensor:
    """DDIM for flow matching (``x = (1 - sigma) x0 + sigma eps``). Per step ``s -> t`` (``s = sigma``,
    ``t = sigma'``): ``x0 = x - s v``, ``eps_hat = (x - (1 - s) x0) / s``, ``std = eta t``,
    ``rho = std sqrt(1 - t^2 (1 - s)^2 / (s^2 (1 - t)^2))``,
    ``x' = (1 - t) x0 + sqrt(t^2 - rho^2) eps_hat + rho z``. With ``eta = 0`` this is ``x + (t - s) v``
    (Euler); at ``t = 0`` it returns ``x0``."""
    s_ = _sig(sigmas)
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    x = x.float()
    for i in range(len(s_) - 1):
        s, t = s_[i], s_[i + 1]
        x0 = x - s * velocity(x, s, i).float()
        std = eta * t
        rho = std * math.sqrt(1.0 - t ** 2 * (1 - s) ** 2 / (s ** 2 * (1 - t) ** 2)) if std > 0 else 0.0
        if rho > t:
            raise ValueError(f"ddim: eta = {eta} makes the noise (rho = {rho:.4g}) exceed sigma' = {t:.4g} at step {i}")
        eps_hat = (x - (1 - s) * x0) / s
        x_next = (1 - t) * x0 + math.sqrt(t ** 2 - rho ** 2) * eps_hat
        if rho > 0:
            x_next = x_next + rho * _randn(x, generator)
        x = x_next
    return x


SOLVERS = {"euler": euler_ode, "flow_sde": flow_sde, "dpm2": dpm2, "ddim": ddim, "ddim_sde": ddim}


def sample(solver: str, velocity: VelocityFn, x: torch.Tensor, sigmas, *, eta: float = 0.7,
           generator: Generators = None) -> torch.Tensor:
    """Dispatch by name: ``"dpm2"`` | ``"euler"`` | ``"ddim"`` (deterministic) | ``"flow_sde"`` | ``"ddim_sde"``
    (the two stochastic ones use ``eta`` / ``generator``)."""
    if solver == "flow_sde":
        return flow_sde(velocity, x, sigmas, eta=eta, generator=generator)
    if solver == "ddim_sde":
        return ddim(velocity, x, sigmas, eta=eta, generator=generator)
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {sorted(SOLVERS)}, got {solver!r}")
    return SOLVERS[solver](velocity, x, sigmas)
