"""``rewardkit ls``: every registered reward with its tasks, dimensions, extras, whether it gives gradients to
pixels (``grad``: ``reward.score_tensor``) and whether its extras are installed."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser("ls", help="list rewards", description="List registered rewards (builtin and plugins).")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def describe_rewards() -> list[dict]:
    from .._imports import extra_installed
    from ..registry import ALIASES, _build, conflicts, get_reward_class

    rows = []
    clashes = conflicts()
    for name in sorted(_build()):
        row = {"name": name, "aliases": sorted(a for a, t in ALIASES.items() if t == name)}
        if name in clashes:
            row.update(error="claimed by several entries: " + "; ".join(clashes[name]))
            rows.append(row)
            continue
        try:
            cls = get_reward_class(name)
        except Exception as exc:  # a broken plugin is reported, not fatal to `ls`
            row.update(error=f"{type(exc).__name__}: {exc}")
            rows.append(row)
            continue
        extras = list(getattr(cls, "extras", ()))
        row.update(
            tasks=sorted(cls.tasks), dimensions=list(cls.dimensions), extras=extras,
            installed=all(extra_installed(e) for e in extras), higher_is_better=cls.higher_is_better,
            differentiable=bool(cls.differentiable),
            score_range=list(cls.score_range) if cls.score_range else None,
            summary=(cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
        )
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> int:
    rows = describe_rewards()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("reward", "tasks", "dimensions", "extras", "grad", "installed", "range")
    table = [header]
    for r in rows:
        if "error" in r:
            table.append((r["name"], "-", "-", "-", "-", "ERROR", r["error"]))
            continue
        rng = "-" if r["score_range"] is None else f"[{r['score_range'][0]:g}, {r['score_range'][1]:g}]"
        dims = ",".join(r["dimensions"]) or "-"
        extras = ",".join(r["extras"]) or "-"
        name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
        inst = "yes" if r["installed"] else f"no: pip install 'rewardkit-vision[{extras}]'"
        grad = "yes" if r["differentiable"] else "-"  # reward.score_tensor gives gradients to pixels
        table.append((name, ",".join(r["tasks"]), dims, extras, grad, inst, rng))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + str(row[-1]))
    return 0
