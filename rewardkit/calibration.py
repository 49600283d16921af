"""Calibration statistics: what a reward's raw scores look like on a reference set.

"What does this score mean?" is the most asked question about every reward model. ``rewardkit calibrate``
scores a reference set with any reward and stores the statistics computed here; preference models keep them
in their directory (``normalize="calibration" | "quantile"``), composites read them per axis
(``normalize: fixed`` with ``calibration: stats.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

__all__ = ["calibration_stats", "apply_calibration", "load_calibration"]


def calibration_stats(scores: torch.Tensor, quantiles: Sequence[float] = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)) -> dict[str, Any]:
    """Mean, std (population), min, max and quantiles of finite raw scores ``[N]`` (N >= 2)."""
    s = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    s = s[torch.isfinite(s)]
    if s.numel() < 2:
        raise ValueError(f"calibration needs at least 2 finite scores, got {s.numel()}")
    qs = [float(q) for q in quantiles]
    return {"n": int(s.numel()), "mean": float(s.mean()), "std": float(s.std(unbiased=False)),
            "min": float(s.min()), "max": float(s.max()),
            "quantiles": {f"{q:g}": float(torch.quantile(s, q)) for q in qs}}


def apply_calibration(scores: torch.Tensor, stats: dict[str, Any], mode: str) -> torch.Tensor:
    """``mode="calibration"``: z-score ``(s - mean) / std``; ``mode="quantile"``: empirical CDF in [0, 1],
    piecewise-linear between the saved quantiles (clamped outside them). Shapes ``[B] -> [B]``."""
    s = scores.double()
    if mode == "calibration":
        std = float(stats["std"])
        if not std > 0:
            raise ValueError("calibration std is zero; recompute calibration on a more varied set")
        return ((s - float(stats["mean"])) / std).float()
    if mode == "quantile":
        pairs = sorted((float(q), float(v)) for q, v in stats["quantiles"].items())
        if len(pairs) < 2:
            raise ValueError("quantile normalisation needs at least 2 saved quantiles")
        qs = torch.tensor([p[0] for p in pairs], dtype=torch.float64, device=s.device)
        vs = torch.tensor([p[1] for p in pairs], dtype=torch.float64, device=s.device)
        idx = torch.searchsorted(vs, s.clamp(vs[0], vs[-1]), right=True).clamp(1, len(vs) - 1)
        lo_v, hi_v, lo_q, hi_q = vs[idx - 1], vs[idx], qs[idx - 1], qs[idx]
        t = torch.where(hi_v > lo_v, (s.clamp(vs[0], vs[-1]) - lo_v) / (hi_v - lo_v).clamp_min(1e-300), torch.zeros_like(s))
        out = lo_q + t * (hi_q - lo_q)
        return torch.where(torch.isfinite(s), out, s).float()
    raise ValueError(f"unknown normalisation {mode!r}")


def load_calibration(path: str | Path) -> dict[str, Any]:
    """Read a statistics file written by ``rewardkit calibrate`` (JSON with at least ``mean`` and ``std``)."""
    p = Path(path)
    try:
        stats = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"calibration file not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p} is not a calibration JSON file ({exc})") from None
    missing = [k for k in ("mean", "std") if not isinstance(stats.get(k), (int, float))]
    if missing:
        raise ValueError(f"{p} lacks numeric {missing}: write it with `rewardkit calibrate`")
    return stats
