"""Pure functions of reward composition: per-axis z-score, intent gate, detector veto, the combined reward.

Every function takes and returns float32 tensors of shape ``[B]`` (one entry per sample in the batch) and
has no state, so each formula is tested on hand-computed cases (``tests/compose/test_composite.py``).

NaN marks "no value" throughout: an invalid or not-applicable raw score stays NaN after z-scoring, and the
combination decides per sample whether a NaN matters (it does not when the axis is gated off).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

__all__ = ["zscore", "group_zscore", "intent_gate", "veto", "additive_penalty", "combine", "INTENT_LABELS",
           "ZSCORE_MODES", "DEFAULT_EPS"]

INTENT_LABELS = ("strict", "neutral", "open")

#: ``"cutoff"``: ``std < eps -> 0`` else ``(x - mean) / std``; ``"rl"``: ``(x - mean) / (std + eps)`` (flow_grpo /
#: DiffusionNFT advantages). The RL form is continuous in the data: scores that differ only by float rounding give
#: z close to 0, where the cut-off form jumps to +-1 as soon as the std crosses ``eps``.
ZSCORE_MODES = ("cutoff", "rl")
#: default ``eps`` per mode (flow_grpo adds 1e-4 to the group std).
DEFAULT_EPS = {"cutoff": 1e-6, "rl": 1e-4}


def zscore(x: torch.Tensor, mask: torch.Tensor | None = None, eps: float | None = None, *,
           mode: str = "cutoff") -> torch.Tensor:
    """Z-scores over the entries where ``mask`` is True and ``x`` is finite.

    Args:
        x: float tensor ``[B]``.
        mask: optional bool tensor ``[B]``; False entries are excluded from the statistics and return NaN.
        eps: ``None`` = ``DEFAULT_EPS[mode]``.
        mode: ``"cutoff"``: ``(x - mean) / std``, and an axis whose population std is below ``eps`` (zero
            variance, or a single sample) yields 0 for every included entry. ``"rl"``: ``(x - mean) / (std +
            eps)`` everywhere (flow_grpo's advantage formula, eps 1e-4): zero variance gives 0 as well, and
            near-zero variance gives values near 0 instead of +-1. Never NaN or Inf in either mode.

    Returns:
        float32 ``[B]``: z-scores where included, NaN elsewhere. The std is the population std (ddof=0),
        as in flow_grpo / DiffusionNFT's group advantages.
    """
    if mode not in ZSCORE_MODES:
        raise ValueError(f"mode must be one of {ZSCORE_MODES}, got {mode!r}")
    eps = DEFAULT_EPS[mode] if eps is None else float(eps)
    if not (eps >= 0 and eps < float("inf")) or (mode == "rl" and eps == 0):
        raise ValueError(f"eps must be finite and {'> 0' if mode == 'rl' else '>= 0'}, got {eps}")
    x = torch.as_tensor(x, dtype=torch.float32).reshape(-1)
    keep = torch.isfinite(x)
    if mask is not None:
        keep = keep & torch.as_tensor(mask, dtype=torch.bool).reshape(-1)
    out = torch.full_like(x, float("nan"))
    n = int(keep.sum())
    if n == 0:
        return out
    vals = x[keep].double()
    mean = vals.mean()
    std = vals.std(unbiased=False) if n > 1 else vals.new_zeros(())
    if mode == "rl":
        out[keep] = ((vals - mean) / (std + eps)).float()
    elif float(std) < eps or float(std) == 0.0:  # eps = 0 is allowed: a constant axis is still 0, not 0 / 0
        out[keep] = 0.0
    else:
        out[keep] = ((vals - mean) / std).float()
    return out


def group_zscore(x: torch.Tensor, groups: Sequence[Hashable], mask: torch.Tensor | None = None,
                 eps: float | None = None, *, mode: str = "cutoff") -> torch.Tensor:
    """:func:`zscore` computed separately inside each group (e.g. the K rollouts of one prompt).

    Args:
        x: float tensor ``[B]``.
        groups: B hashable group keys (samples with equal keys are normalised together).
        mask: optional bool ``[B]`` as in :func:`zscore`.
        eps, mode: as in :func:`zscore`.
    """
    x = torch.as_tensor(x, dtype=torch.float32).reshape(-1)
    if len(groups) != x.shape[0]:
        raise ValueError(f"got {len(groups)} group keys for {x.shape[0]} values")
    mask_t = torch.ones_like(x, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
    out = torch.full_like(x, float("nan"))
    index: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    for idx in index.values():
        t = torch.tensor(idx, dtype=torch.long)
        out[t] = zscore(x[t], mask_t[t], eps, mode=mode)
    return out


def intent_gate(intents: Sequence[str | None], on: Sequence[str] = ("strict",)) -> torch.Tensor:
    """``g_i = 1`` when sample i's intent label is in ``on`` (default: only ``strict``), else 0.

    Returns float32 ``[B]`` of 0/1. A missing label (None) gates the axis off.
    """
    on_set = set(on)
    return torch.tensor([1.0 if (lab is not None and lab in on_set) else 0.0 for lab in intents],
                        dtype=torch.float32)


def veto(z_pref: torch.Tensor, fired: torch.Tensor, strength: float = 1.0) -> torch.Tensor:
    """One-sided detector veto: ``z' = z - v * max(z, 0)`` with ``v = strength * fired``.

    A fired detector removes the positive part of the preference z-score (strength 1: it clips at 0); a
    negative z-score is untouched, and a sample that evades detection (``fired = 0``) gains nothing.

    Args:
        z_pref: float ``[B]`` preference z-scores.
        fired: float or bool ``[B]``, 1 where an applicable detector fired.
        strength: ``v`` for a fired detector, in [0, 1].
    """
    z = torch.as_tensor(z_pref, dtype=torch.float32)
    v = torch.as_tensor(fired, dtype=torch.float32) * float(strength)
    return z - v * z.clamp(min=0)


def additive_penalty(z_pref: torch.Tensor, fired: torch.Tensor, penalty: float = 1.0) -> torch.Tensor:
    """The ablated alternative to :func:`veto`: ``z' = z - penalty * fired`` (a detector term in the sum).

    Unlike the veto it also lowers negative z-scores, so evading a detector is rewarded relative to firing it.
    """
    z = torch.as_tensor(z_pref, dtype=torch.float32)
    return z - float(penalty) * torch.as_tensor(fired, dtype=torch.float32)


def combine(terms: Sequence[torch.Tensor], weights: Sequence[float],
            gates: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
    """``R_i = sum_k w_k * g_k,i * z_k,i``.

    A gated-off entry (``g = 0``) contributes exactly 0 even when its z-score is NaN (the axis was not
    asked); a NaN z-score under an open gate makes ``R_i`` NaN (the caller reports why).

    Args:
        terms: K float tensors ``[B]`` (z-scores, vetoed where applicable).
        weights: K floats.
        gates: K optional float tensors ``[B]`` of 0/1 (None = always on).

    Returns:
        float32 ``[B]``.
    """
    if len(terms) != len(weights):
        raise ValueError(f"{len(terms)} terms but {len(weights)} weights")
    if not terms:
        raise ValueError("combine needs at least one term")
    gates = list(gates) if gates is not None else [None] * len(terms)
    total = torch.zeros_like(torch.as_tensor(terms[0], dtype=torch.float32))
    for z, w, g in zip(terms, weights, gates):
        z = torch.as_tensor(z, dtype=torch.float32)
        contrib = float(w) * z
        if g is not None:
            g = torch.as_tensor(g, dtype=torch.float32)
            contrib = torch.where(g > 0, g * contrib, torch.zeros_like(contrib))
        total = total + contrib
    return total
