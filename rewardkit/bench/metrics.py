"""Preference-benchmark metrics as pure functions over numpy arrays.

Notation (``reference/benchmarks.md`` section 5): for a comparison,

- ``h`` is the human label: ``+1`` (A / left / candidate_1 better), ``-1`` (B better), ``0`` (human tie);
- ``m`` is the model margin ``s_A - s_B`` (already sign-flipped for lower-is-better rewards); ``NaN`` means
  the model gave no answer (invalid score).

Every function returns a :class:`MetricValue` (``value`` in [0, 1] or NaN when nothing could be counted,
``n`` = the denominator, plus metric-specific ``extra`` fields such as the chosen tie threshold). Functions
never drop an item silently: what they exclude is counted in ``extra``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

__all__ = [
    "MetricValue",
    "accuracy_without_ties",
    "accuracy_with_ties_at",
    "accuracy_with_ties",
    "accuracy_with_ties_naive",
    "mmrb2_official",
    "genaibench_4way",
    "normalise_4way_verdict",
    "group_accuracy",
    "order_agreement",
    "bootstrap_ci",
    "bootstrap_weights",
    "bootstrap_ratio_ci",
    "bootstrap_ties_ci",
    "ratio_units",
    "verdict_from_margin",
    "flip_verdict",
]


#: extras stored exactly (not rounded to 10 decimals): values that are compared against margins
EXACT_EXTRAS = frozenset({"threshold"})


@dataclass
class MetricValue:
    """One metric's result. ``ci`` is the bootstrap 95% interval (filled by the harness)."""

    value: float
    n: int
    extra: dict[str, Any] = field(default_factory=dict)
    ci: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        def f(x: float) -> float | None:
            return None if x is None or not math.isfinite(x) else round(float(x), 10)

        def clean(v: Any) -> Any:  # JSON without NaN: undefined values become null
            if isinstance(v, float):
                return f(v)
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            return v

        def exact(x: Any) -> Any:  # a fitted threshold is a margin itself: rounding it moves the boundary
            return None if x is None or not math.isfinite(x) else float(x)

        d: dict[str, Any] = {"value": f(self.value), "n": int(self.n)}
        if self.ci is not None:
            d["ci95"] = [f(self.ci[0]), f(self.ci[1])]
        d.update({k: exact(v) if k in EXACT_EXTRAS and isinstance(v, float) else clean(v)
                  for k, v in self.extra.items()})
        return d


def _arrays(h: Any, m: Any) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(h, dtype=np.int64).reshape(-1)
    m = np.asarray(m, dtype=np.float64).reshape(-1)
    if h.shape != m.shape:
        raise ValueError(f"labels and margins differ in length: {h.shape[0]} vs {m.shape[0]}")
    if h.size and not np.isin(h, (-1, 0, 1)).all():
        raise ValueError("labels must be +1 (A better), -1 (B better) or 0 (tie)")
    return h, m


def _ratio(num: float, den: int) -> float:
    return float(num) / den if den else float("nan")


# ------------------------------------------------------------------------------------------ scalar metrics
def accuracy_without_ties(h: Any, m: Any) -> MetricValue:
    """Pairwise accuracy over pairs with a human preference (``h != 0``): correct iff ``sign(m) == h``.

    A model tie (``m == 0``) counts as wrong (MMRB2's official rule); ``half_credit`` gives it 0.5 instead.
    Human ties are excluded (``n_human_ties``), invalid margins are excluded (``n_invalid``).
    On benchmarks without human ties (MMRB2, EditReward-Bench K>=3) this is plain pairwise accuracy.
    """
    h, m = _arrays(h, m)
    ok = np.isfinite(m)
    keep = ok & (h != 0)
    hk, mk = h[keep], m[keep]
    correct = np.sign(mk) == hk
    ties = mk == 0
    n = int(keep.sum())
    return MetricValue(
        value=_ratio(correct.sum(), n), n=n,
        extra={"n_model_ties": int(ties.sum()), "half_credit": _ratio(correct.sum() + 0.5 * ties.sum(), n),
               "n_human_ties": int(((h == 0) & ok).sum()), "n_invalid": int((~ok).sum())})


def accuracy_with_ties_at(h: Any, m: Any, eps: float) -> float:
    """Accuracy with ties (Deutsch et al. 2023) at threshold ``eps``: the model predicts a tie iff
    ``|m| <= eps``; ``acc = (C + T_hm) / (C + D + T_h + T_m + T_hm)``, i.e. correct / all valid pairs."""
    h, m = _arrays(h, m)
    ok = np.isfinite(m)
    h, m = h[ok], m[ok]
    model_tie = np.abs(m) <= eps
    correct = np.where(model_tie, h == 0, np.sign(m) == h)
    return _ratio(correct.sum(), h.size)


def accuracy_with_ties_naive(h: Any, m: Any) -> tuple[float, float]:
    """Reference O(N^2) tie calibration: try ``eps`` in {0} U {|m_i|}; returns ``(best acc, eps*)``
    (the smallest threshold among equally good ones). Kept for cross-checking the fast version."""
    h, m = _arrays(h, m)
    m_ok = m[np.isfinite(m)]
    best, best_eps = float("nan"), 0.0
    for eps in sorted({0.0, *np.abs(m_ok).tolist()}):
        acc = accuracy_with_ties_at(h, m, eps)
        if not (acc <= best):  # first, or strictly better (NaN-safe)
            best, best_eps = acc, eps
    return best, best_eps


def accuracy_with_ties(h: Any, m: Any) -> MetricValue:
    """Tie-calibrated accuracy with ties: the best :func:`accuracy_with_ties_at` over every candidate
    threshold ``eps`` in {0} U {|m_i|}, found exhaustively in O(N log N).

    ``eps = 0`` is the "no model ties" state (only exact zeros are ties). Pairs sharing one ``|m|`` switch
    to "tie" together (the published incremental implementation evaluates half-updated states there).
    The threshold is fitted on the evaluated set, so the value is optimistic; ``threshold`` reports it.
    Human ties (``h == 0``) stay in the denominator; invalid margins are excluded (``n_invalid``).
    """
    h, m = _arrays(h, m)
    ok = np.isfinite(m)
    hv, mv = h[ok], m[ok]
    n = int(hv.size)
    extra: dict[str, Any] = {"n_human_ties": int((hv == 0).sum()), "n_invalid": int((~ok).sum())}
    if n == 0:
        return MetricValue(float("nan"), 0, {**extra, "threshold": None, "n_model_ties": 0})
    a = np.abs(mv)
    order = np.argsort(a, kind="stable")
    a_sorted = a[order]
    tie_ok = (hv == 0)[order].astype(np.int64)            # correct if predicted tie
    dec_ok = (np.sign(mv) == hv)[order].astype(np.int64)  # correct if predicted decisive
    # Threshold a_sorted[k] makes the first (last index with that value)+1 pairs ties.
    pre_tie = np.concatenate([[0], np.cumsum(tie_ok)])
    suf_dec = np.concatenate([np.cumsum(dec_ok[::-1])[::-1], [0]])
    ends = np.flatnonzero(np.r_[a_sorted[1:] != a_sorted[:-1], True]) + 1  # prefix lengths per unique |m|
    cand_eps = a_sorted[ends - 1]
    cand_correct = pre_tie[ends] + suf_dec[ends]
    # eps = 0 when no |m| is exactly 0: no pair is a tie.
    if cand_eps[0] > 0:
        cand_eps = np.r_[0.0, cand_eps]
        cand_correct = np.r_[suf_dec[0], cand_correct]
    k = int(np.argmax(cand_correct))  # first maximum = smallest threshold
    eps = float(cand_eps[k])
    return MetricValue(float(cand_correct[k]) / n, n,
                       {**extra, "threshold": eps, "n_model_ties": int((a <= eps).sum()),
                        "at_zero": float(cand_correct[0] / n)})


# ------------------------------------------------------------------------------------------ verdict metrics
def verdict_from_margin(m: float) -> str | None:
    """``"A"`` / ``"B"`` / ``"tie"`` from a margin; ``None`` when the margin is NaN (no answer)."""
    if m is None or not math.isfinite(m):
        return None
    return "A" if m > 0 else ("B" if m < 0 else "tie")


def flip_verdict(v: str | None) -> str | None:
    """A <-> B (other answers unchanged), as the official MMRB2 scorer flips reverse-order judgements."""
    return {"A": "B", "B": "A"}.get(v, v) if v is not None else None


def mmrb2_official(chosen: Sequence[str], forward: Sequence[str | None],
                   reverse: Sequence[str | None]) -> MetricValue:
    """MMRB2's official accuracy (``evaluate/compute_scores/compute_accuracy.py``).

    Args:
        chosen: ``N`` human labels, "A" or "B" (case-insensitive).
        forward: ``N`` judgements in the original order ("A", "B", anything else = wrong, None/"" = no answer).
        reverse: ``N`` judgements with A and B swapped, *as answered* (in the swapped presentation); they are
            flipped back here.

    Each non-empty judgement adds one to the denominator and counts as correct iff it equals ``chosen``;
    a tie or unparsed answer counts wrong; an empty answer leaves the denominator (``n_missing``).
    """
    if not (len(chosen) == len(forward) == len(reverse)):
        raise ValueError("chosen, forward and reverse must have the same length")
    correct = judged = missing = 0
    for c, f, r in zip(chosen, forward, reverse):
        c = str(c).strip().upper()
        for j in (f, flip_verdict(r) if r else r):
            if not j:
                missing += 1
                continue
            judged += 1
            correct += str(j).strip().upper() == c
    return MetricValue(_ratio(correct, judged), judged, {"n_pairs": len(chosen), "n_missing": missing})


_VOTES = ("leftvote", "rightvote", "tievote", "bothbad_vote")
_ACCEPT = {"leftvote": {"A>>B", "A>B"}, "rightvote": {"B>>A", "B>A"},
           "tievote": {"A=B", "A=B=GOOD"}, "bothbad_vote": {"A=B", "A=B=BAD"}}


def normalise_4way_verdict(v: str | None) -> str | None:
    """``"[[A=B=Good]]"`` -> ``"A=B=GOOD"``: the first ``[[...]]`` if present (the official parser's rule),
    upper-cased and without spaces; None stays None."""
    if v is None:
        return None
    s = str(v)
    i = s.find("[[")
    if i >= 0:
        j = s.find("]]", i + 2)
        s = s[i + 2:j] if j >= 0 else s[i + 2:]
    s = s.replace(" ", "").upper()
    return s or None


def genaibench_4way(votes: Sequence[str], verdicts: Sequence[str | None]) -> MetricValue:
    """GenAI-Bench official 4-way accuracy (``TIGER-AI-Lab/GenAI-Bench`` ``inference.py``).

    ``votes`` are ``vote_type`` strings; ``verdicts`` are judge answers such as ``"[[A>B]]"``, ``"B>A"``,
    ``"A=B=Good"``, ``"A=B=Bad"`` (``"A=B"`` matches both tie kinds). An unparsed or missing verdict counts
    as wrong and stays in the denominator.
    """
    if len(votes) != len(verdicts):
        raise ValueError("votes and verdicts must have the same length")
    correct = unparsed = 0
    for vote, verdict in zip(votes, verdicts):
        if vote not in _ACCEPT:
            raise ValueError(f"unknown GenAI-Bench vote_type {vote!r}; expected one of {_VOTES}")
        v = normalise_4way_verdict(verdict)
        if v is None or v not in {"A>>B", "A>B", "B>>A", "B>A", "A=B", "A=B=GOOD", "A=B=BAD"}:
            unparsed += 1
            continue
        correct += v in _ACCEPT[vote]
    return MetricValue(_ratio(correct, len(votes)), len(votes), {"n_unparsed": unparsed})


def group_accuracy(group_ids: Sequence[Any], h: Any, m: Any) -> MetricValue:
    """EditReward-Bench group accuracy for K >= 3: a group (one instruction, K candidates, C(K,2) rows) is
    correct iff every row is: ``sign(m) == h`` for decisive rows, ``m == 0`` for a human-tie row.

    For scalar rewards this equals "the predicted ranking equals the human ranking"; a model tie inside a
    group makes it wrong. Groups with an invalid margin are excluded (``n_invalid_groups``).
    ``individual`` is the per-row accuracy over valid rows.
    """
    h, m = _arrays(h, m)
    if len(group_ids) != h.size:
        raise ValueError("group_ids must have one entry per row")
    row_ok = np.where(h == 0, m == 0, np.sign(m) == h)
    valid = np.isfinite(m)
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    n_ok = n_groups = n_bad = 0
    sizes: dict[int, int] = {}
    for rows in groups.values():
        if not valid[rows].all():
            n_bad += 1
            continue
        n_groups += 1
        sizes[len(rows)] = sizes.get(len(rows), 0) + 1
        n_ok += bool(row_ok[rows].all())
    return MetricValue(_ratio(n_ok, n_groups), n_groups,
                       {"n_invalid_groups": n_bad, "individual": _ratio(row_ok[valid].sum(), int(valid.sum())),
                        "rows_per_group": {str(k): v for k, v in sorted(sizes.items())}})


def order_agreement(forward: Sequence[str | None], reverse: Sequence[str | None]) -> MetricValue:
    """Fraction of pairs whose verdict survives the A/B swap (``reverse`` as answered, flipped here).

    Only pairs with a decisive answer in both orders count. 1.0 for any scalar reward.
    """
    agree = n = 0
    for f, r in zip(forward, reverse):
        if f in ("A", "B") and r in ("A", "B"):
            n += 1
            agree += f == flip_verdict(r)
    return MetricValue(_ratio(agree, n), n, {})


# ------------------------------------------------------------------------------------------ bootstrap
def bootstrap_ci(stat: Callable[[np.ndarray], float], n_units: int, *, n_boot: int = 1000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``stat(indices)`` over ``n_units`` resampling units.

    ``stat`` receives an int array ``[n_units]`` of unit indices drawn with replacement (units are rows,
    or groups for group metrics) and returns the metric; metrics that fit something (the tie threshold)
    re-fit it on every resample. Resamples where the metric is undefined (NaN) are dropped. Returns None
    when ``n_boot == 0`` or there is nothing to resample.
    """
    if n_boot <= 0 or n_units <= 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_units, size=(n_boot, n_units))
    vals = np.array([stat(row) for row in idx], dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return None
    lo, hi = np.quantile(vals, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def bootstrap_weights(n_units: int, n_boot: int, seed: int = 0) -> np.ndarray:
    """Resampling multiplicities ``[n_boot, n_units]``: row b counts how often each unit was drawn in
    bootstrap sample b (n_units draws with replacement), so a weighted sum equals the resampled sum."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_units, size=(n_boot, n_units))
    flat = idx + (np.arange(n_boot)[:, None] * n_units)
    return np.bincount(flat.ravel(), minlength=n_boot * n_units).reshape(n_boot, n_units)


def _percentile(vals: np.ndarray, alpha: float) -> tuple[float, float] | None:
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return None
    lo, hi = np.quantile(vals, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def bootstrap_ratio_ci(num: Any, den: Any, *, n_boot: int = 1000, seed: int = 0,
                       alpha: float = 0.05) -> tuple[float, float] | None:
    """Percentile CI of ``sum(num) / sum(den)`` over resampled units (vectorised).

    ``num`` / ``den`` are per-unit ``[U]`` counts, e.g. correct / judged judgements per MMRB2 pair, or
    correct / valid per EditReward group. The same draws as :func:`bootstrap_ci` for one ``seed``.
    """
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    if n_boot <= 0 or num.size == 0:
        return None
    w = bootstrap_weights(num.size, n_boot, seed).astype(np.float64)
    d = w @ den
    with np.errstate(invalid="ignore", divide="ignore"):
        vals = np.where(d > 0, (w @ num) / np.where(d > 0, d, 1.0), np.nan)
    return _percentile(vals, alpha)


def bootstrap_ties_ci(h: Any, m: Any, *, n_boot: int = 1000, seed: int = 0,
                      alpha: float = 0.05) -> tuple[float, float] | None:
    """Percentile CI of tie-calibrated :func:`accuracy_with_ties`, re-fitting the threshold on every
    resample (vectorised over resamples).

    A resample's best threshold over its own drawn ``|m|`` values gives the same accuracy as the best over
    all ``|m|`` values: an undrawn value classifies the drawn items exactly like the largest drawn value
    below it (or the no-tie state), so one global sort serves every resample. Invalid margins get weight 0.
    """
    h, m = _arrays(h, m)
    if n_boot <= 0 or h.size == 0:
        return None
    w = bootstrap_weights(h.size, n_boot, seed).astype(np.float64)
    ok = np.isfinite(m)
    w[:, ~ok] = 0.0
    a = np.where(ok, np.abs(m), np.inf)
    order = np.argsort(a, kind="stable")
    a_s = a[order]
    ws = w[:, order]
    tie_ok = (h == 0)[order].astype(np.float64)
    dec_ok = (np.sign(np.where(ok, m, 0.0)) == h)[order].astype(np.float64) * ok[order]
    pre_tie = np.concatenate([np.zeros((n_boot, 1)), np.cumsum(ws * tie_ok, axis=1)], axis=1)
    suf_dec = np.concatenate([np.cumsum((ws * dec_ok)[:, ::-1], axis=1)[:, ::-1], np.zeros((n_boot, 1))], axis=1)
    n_ok = int(ok.sum())
    ends = np.flatnonzero(np.r_[a_s[1:n_ok] != a_s[:n_ok - 1], True]) + 1 if n_ok else np.array([], int)
    cand = pre_tie[:, ends] + suf_dec[:, ends]
    cand = np.concatenate([suf_dec[:, :1], cand], axis=1)  # the no-tie state
    tot = ws.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        vals = np.where(tot > 0, cand.max(1) / np.where(tot > 0, tot, 1.0), np.nan)
    return _percentile(vals, alpha)


def ratio_units(name: str, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ``(num, den)`` whose summed ratio is the metric ``name`` (for the vectorised bootstrap).

    Keywords: ``h``, ``m`` (accuracy_without_ties); ``chosen``, ``forward``, ``reverse`` (mmrb2_official);
    ``votes``, ``verdicts`` (genaibench_4way); ``forward``, ``reverse`` (order_agreement).
    """
    if name == "accuracy_without_ties":
        h, m = _arrays(kw["h"], kw["m"])
        keep = np.isfinite(m) & (h != 0)
        return ((np.sign(np.where(keep, m, 0.0)) == h) & keep).astype(float), keep.astype(float)
    if name == "mmrb2_official":
        num, den = [], []
        for c, f, r in zip(kw["chosen"], kw["forward"], kw["reverse"]):
            c = str(c).strip().upper()
            js = [j for j in (f, flip_verdict(r) if r else r) if j]
            den.append(len(js))
            num.append(sum(str(j).strip().upper() == c for j in js))
        return np.array(num, float), np.array(den, float)
    if name == "genaibench_4way":
        num = [float(normalise_4way_verdict(v) in _ACCEPT[vote]) for vote, v in zip(kw["votes"], kw["verdicts"])]
        return np.array(num, float), np.ones(len(num))
    if name == "order_agreement":
        num, den = [], []
        for f, r in zip(kw["forward"], kw["reverse"]):
            ok = f in ("A", "B") and r in ("A", "B")
            den.append(float(ok))
            num.append(float(ok and f == flip_verdict(r)))
        return np.array(num, float), np.array(den, float)
    raise ValueError(f"metric {name!r} is not a ratio of per-row counts")
