"""``rewardkit ls``: every registered reward with its tasks, dimensions, extras and whether they are installed."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser("ls", help="list rewards", description="List registered rewards (builtin and plugins): "
                       "tasks, score range, the extras they need and whether those are installed.")
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
            score_range=list(cls.score_range) if cls.score_range else None,
            summary=(cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
        )
        rows.append(row)
    return rows


COLUMNS = ("reward (aliases)", "tasks", "range", "extras", "installed", "what")  # "what": an indented line
WIDTH = 100  # the table fits a 100-column terminal; --json has everything (dimensions, full summaries)


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """The cells of `rewardkit ls` (the README's reward table has the same columns)."""
    out = []
    for r in rows:
        name = r["name"] + (f" ({', '.join(r['aliases'])})" if r.get("aliases") else "")
        if "error" in r:
            out.append((name, "-", "-", "-", "ERROR", r["error"]))
            continue
        rng = "-" if r["score_range"] is None else f"[{r['score_range'][0]:g}, {r['score_range'][1]:g}]"
        out.append((name, ",".join(r["tasks"]), rng, ",".join(r["extras"]) or "-",
                    "yes" if r["installed"] else "no", r["summary"]))
    return out


def run(args: argparse.Namespace) -> int:
    rows = describe_rewards()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    import textwrap

    table = [COLUMNS[:-1], *[r[:-1] for r in table_rows(rows)]]
    whats = [None, *[r[-1] for r in table_rows(rows)]]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    for row, what in zip(table, whats):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if what:  # the description on its own indented line(s): the table stays within WIDTH columns
            for line in textwrap.wrap(what.replace("``", ""), WIDTH - 4, max_lines=2, placeholder=" ..."):
                print("    " + line)
    missing = sorted({e for r in rows if "error" not in r and not r["installed"] for e in r["extras"]})
    if missing:
        print(f"\nnot installed: pip install 'rewardkit-vision[{','.join(missing)}]'")
    print("\nrewardkit ls --json: dimensions, score ranges and full descriptions")
    return 0
