"""Several rewards on the same images: one row per image (joined on ``id`` where every file has one, else on
the image file, wherever each score file names it from, and the prompt), each reward's score and rank, and how far the ranks disagree.

Ranks are 1 = highest score, ties share their average rank, computed over the rows every reward scored
validly. ``gap`` is the largest rank difference between two rewards divided by ``n - 1`` (0: same place,
1: one reward's best is another's worst); a row is flagged as a disagreement when ``gap >= DISAGREE_GAP``.
Spearman's rho (the Pearson correlation of the ranks) is given for every pair of rewards.
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["rewards_section", "average_ranks", "spearman", "DISAGREE_GAP"]

DISAGREE_GAP = 0.25


def average_ranks(values: list[float]) -> list[float]:
    """Rank 1 for the largest value; tied values share the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's r of average ranks); None with fewer than 3 rows or no spread."""
    if len(x) < 3:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def _key(row: dict[str, Any], by_id: bool) -> Any:
    if by_id:
        return ("id", row["id"])
    if row.get("img") is not None:  # the image store's key: one per resolved file (or content), across files
        return ("img", row["img"], row["prompt"])
    return ("path", os.path.normpath(row["path"]) if row.get("path") else None, row["prompt"])


def rewards_section(sections: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``rewards`` section joining the ``scores`` sections; None when fewer than two share an image."""
    if len(sections) < 2:
        return None
    by_id = all(r.get("id") is not None for s in sections for r in s["rows"])
    keys: list[Any] = []
    joined: dict[Any, dict[str, Any]] = {}
    R = len(sections)
    for j, s in enumerate(sections):
        for r in s["rows"]:
            k = _key(r, by_id)
            if k not in joined:
                keys.append(k)
                joined[k] = {"img": r["img"], "src": r["src"], "prompt": r["prompt"], "path": r.get("path"),
                             "scores": [None] * R, "valid": [None] * R, "errors": [None] * R}
            e = joined[k]
            if e["scores"][j] is None and e["valid"][j] is None:  # first occurrence per file
                e["scores"][j] = r["score"] if r["valid"] else None
                e["valid"][j] = r["valid"]
                e["errors"][j] = r["error"]
    rows = [joined[k] for k in keys]
    common = [i for i, r in enumerate(rows) if all(v is not None for v in r["scores"])]
    if not common:
        shared = [r for r in rows if all(v is not None for v in r["valid"])]
        if not shared:
            return None
    n = len(common)
    for r in rows:
        r["ranks"], r["gap"] = [None] * R, None
    for j in range(R):
        ranks = average_ranks([rows[i]["scores"][j] for i in common])
        for i, rk in zip(common, ranks):
            rows[i]["ranks"][j] = rk
    for i in common:
        rk = rows[i]["ranks"]
        rows[i]["gap"] = (max(rk) - min(rk)) / (n - 1) if n > 1 else 0.0
    rho = [[None if a == b else spearman([rows[i]["scores"][a] for i in common], [rows[i]["scores"][b] for i in common])
            for b in range(R)] for a in range(R)]
    for n_, r in enumerate(rows, 1):
        r["n"] = n_
    names = [s["label"] for s in sections]
    return {"kind": "rewards", "label": " vs ".join(names), "rewards": names,
            "rows": rows, "n_common": n, "spearman": rho, "disagree_gap": DISAGREE_GAP}
