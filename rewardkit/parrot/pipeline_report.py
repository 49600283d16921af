"""The PARROT filter's keep-rate report (``filter_report.json``): keep rate, rejection reasons and, per dimension,
where the rationales' scores stood. A pure function of the stage-1 and stage-2 records. Importable from
:mod:`rewardkit.parrot.pipeline` as before."""

from __future__ import annotations

from typing import Any, Sequence

from .format import DIMENSIONS, ParseError, parse_pairwise

__all__ = ["filter_report", "REASONS"]

#: a stage-2 record's ``reason``
REASONS = ("kept", "wrong_prediction", "unparseable_prediction", "unparseable_rationale", "judge_failure", "skipped")


def filter_report(filtered: Sequence[dict[str, Any]], rationales: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """Keep rate and rejection reasons from stage-2 records (and their stage-1 rationales).

    ``keep_rate`` = kept / rows with a rationale attempt (skipped rows excluded); ``keep_rate_parsed`` = kept /
    rows whose rationale parsed and got a prediction-stage verdict. Per dimension: which section failed to parse
    (unparseable rationales), and over the parsed rationales whether the dimension's scores favoured the label,
    the other image, neither (equal), or did not apply (N/A).
    """
    counts = {r: 0 for r in REASONS}
    unparse_dim: dict[str, int] = {}
    per_dim = {d: {"kept": {"label": 0, "other": 0, "equal": 0, "n/a": 0},
                   "rejected": {"label": 0, "other": 0, "equal": 0, "n/a": 0}} for d in DIMENSIONS}
    for rec in filtered:
        reason = rec["reason"]
        counts[reason] += 1
        if reason == "unparseable_rationale":
            key = rec.get("dimension") or "(format)"
            unparse_dim[key] = unparse_dim.get(key, 0) + 1
        src = rationales.get(rec["row"])
        if reason in ("kept", "wrong_prediction", "unparseable_prediction") and src and src.get("rationale"):
            try:
                p = parse_pairwise(src["rationale"], t2i=src["task"] == "t2i")
            except ParseError:
                continue
            side = "kept" if rec["kept"] else "rejected"
            for d, (a, b) in p.scores.items():
                if a is None:
                    k = "n/a"
                elif a == b:
                    k = "equal"
                else:
                    k = "label" if (a > b) == (rec["label"] == "A") else "other"
                per_dim[d][side][k] += 1
    eligible = len(filtered) - counts["skipped"]
    parsed = counts["kept"] + counts["wrong_prediction"] + counts["unparseable_prediction"]
    return {"records": len(filtered), "counts": counts, "kept": counts["kept"],
            "keep_rate": counts["kept"] / eligible if eligible else None,
            "keep_rate_parsed": counts["kept"] / parsed if parsed else None,
            "rejections": {"wrong_prediction": counts["wrong_prediction"],
                           "unparseable": counts["unparseable_prediction"] + counts["unparseable_rationale"],
                           "unparseable_rationale": counts["unparseable_rationale"],
                           "unparseable_prediction": counts["unparseable_prediction"],
                           "judge_failure": counts["judge_failure"]},
            "unparseable_rationale_by_dimension": unparse_dim, "dimensions": per_dim}
