"""EVR's formula and answer parser as pure functions (the reward itself is :mod:`rewardkit.rewards.evr`, which
re-exports these names): per-dimension rewards from scored and verified hypotheses, their aggregate, the
[0, 1] normalisation, and the strict ``Reason: ... / Score: S`` parser of the evaluator's answers.
"""

from __future__ import annotations

import math
import re

import torch

__all__ = ["dimension_scores", "aggregate_dimensions", "normalise", "parse_hypothesis"]


def dimension_scores(scores: torch.Tensor, verdicts: torch.Tensor | None, *, eps: float = 1e-6,
                     all_rejected: str = "invalid", threshold: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension rewards r_d from hypotheses.

    Args:
        scores: ``[..., K]`` hypothesis scores S in [1, 5]; NaN for a hypothesis that did not parse (ignored).
        verdicts: ``[..., K]`` v in [0, 1] (binary 0/1 or soft P(Yes)); None = no verifier (r_d = mean S).
        eps: the formula's epsilon.
        all_rejected: policy when every parsed hypothesis has v < ``threshold``: ``"invalid"`` (NaN),
            ``"unverified_mean"`` (mean S) or ``"zero"`` (0: the literal formula for binary verdicts; for soft
            verdicts the formula would give the v-weighted mean, so ``"zero"`` is a policy there).

    Returns:
        ``(r [...], rejected [...] bool)``: r is NaN where no hypothesis parsed or the policy says invalid.
    """
    if all_rejected not in ("invalid", "unverified_mean", "zero"):
        raise ValueError(f"all_rejected must be 'invalid', 'unverified_mean' or 'zero', got {all_rejected!r}")
    scores = scores.double()
    ok = torch.isfinite(scores)
    s = torch.where(ok, scores, torch.zeros_like(scores))
    n_ok = ok.sum(-1)
    mean = torch.where(n_ok > 0, s.sum(-1) / n_ok.clamp(min=1), torch.full_like(s[..., 0], math.nan))
    if verdicts is None:
        return mean.float(), torch.zeros_like(n_ok, dtype=torch.bool)
    v = torch.where(ok, verdicts.double(), torch.zeros_like(s))
    r = (v * s).sum(-1) / (v.sum(-1) + eps)
    rejected = (n_ok > 0) & ~((v >= threshold) & ok).any(-1)
    if all_rejected == "invalid":
        r = torch.where(rejected, torch.full_like(r, math.nan), r)
    elif all_rejected == "unverified_mean":
        r = torch.where(rejected, mean, r)
    else:
        r = torch.where(rejected, torch.zeros_like(r), r)
    r = torch.where(n_ok > 0, r, torch.full_like(r, math.nan))
    return r.float(), rejected


def aggregate_dimensions(r: torch.Tensor, how: str = "geometric") -> torch.Tensor:
    """``[..., D]`` per-dimension rewards -> ``[...]``: geometric ``(prod r_d)^(1/D)`` or arithmetic mean.

    NaN in any dimension gives NaN; a zero dimension gives a geometric mean of exactly 0.
    """
    r = r.double()
    if how == "geometric":
        if bool((r < 0).any()):
            raise ValueError("geometric aggregation needs non-negative dimension scores")
        out = r.clamp(min=0).prod(-1) ** (1.0 / r.shape[-1])
    elif how == "arithmetic":
        out = r.mean(-1)
    else:
        raise ValueError(f"aggregate must be 'geometric' or 'arithmetic', got {how!r}")
    out = torch.where(torch.isnan(r).any(-1), torch.full_like(out, math.nan), out)
    return out.float()


def normalise(raw: torch.Tensor) -> torch.Tensor:
    """Map R in [1, 5] to [0, 1]: ``(R - 1) / 4``, clipped (R = 0 under the "zero" policy -> 0)."""
    return ((raw - 1.0) / 4.0).clamp(0.0, 1.0)


# A score value: a plain decimal in [1, 5] ("4", "4.0", "3.5"), optionally "/5" and a final period. No
# exponents, signs, other denominators, words or ranges; ASCII digits only.
_NUM = r"(?P<num>[1-5](?:\.[0-9]+)?)(?:\s*/\s*5(?:\.0+)?)?"
_MD = r"[*_`]*"
# the score label: at the start of a line ("Score: 4", "**Score:** 4", "Score 4") or after text on the same
# line with a colon ("... is correct. Score: 4")
_LABEL_RE = re.compile(r"(?im)(?:^[ \t>#-]*" + _MD + r"[ \t]*score\b" + _MD + r"[ \t]*[:=]?"
                       r"|\bscore\b" + _MD + r"[ \t]*[:=])")
_VALUE_RE = re.compile(r"[ \t]*" + _MD + r"[ \t]*" + _NUM + r"[ \t]*" + _MD + r"[ \t]*\.?[ \t]*" + _MD + r"\s*")
_BARE_RE = re.compile(r"\s*" + _MD + r"\s*" + _NUM + r"\s*" + _MD + r"\s*\.?\s*")
_REASON_RE = re.compile(r"^\s*\**\s*(?:reason|rationale)\s*\**\s*[:=]\s*", re.IGNORECASE)


def parse_hypothesis(text: str, *, cot: bool = True) -> tuple[float, str] | None:
    """``"Reason: ...\\nScore: 4"`` -> ``(4.0, "...")``; None for anything that is not a well-formed score in
    [1, 5].

    Strict: the answer must end with exactly one score label (``Score: S``, ``**Score:** S``) followed only
    by the number (``4``, ``4.0``, ``3.5``, ``4/5``, an optional period) and nothing after it; "Score: 4/10",
    "Score: 1e9", "Score: 4.9e3", "Score: 4 out of 5", "Score: 4-5", "Score: N/A" (even after an earlier
    score), two score labels, or text after the score are all rejected. A rationale may mention numbers and
    the word score ("I'd say score 2 at first") when it is not a ``Score:`` label. With ``cot=False`` a bare
    number (``"4"``, ``"4/5"``) is accepted too; with ``cot=True`` a non-empty reason is required.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    labels = list(_LABEL_RE.finditer(text))
    if labels:
        if len(labels) > 1:
            return None  # several score labels: ambiguous (the model changed its mind, or a template echo)
        m = labels[0]
        v = _VALUE_RE.fullmatch(text, m.end())
        if v is None:
            return None
        value = float(v.group("num"))
        reason = text[:m.start()].strip()
    else:
        v = _BARE_RE.fullmatch(text)
        if cot or v is None:
            return None
        value, reason = float(v.group("num")), ""
    if not (1.0 <= value <= 5.0):
        return None
    reason = _REASON_RE.sub("", reason).strip().strip("*").strip()
    if cot and not reason:
        return None
    return value, reason
