"""``rewardkit rl nft`` output folders as an ``rl`` section: the scalar series of ``metrics.jsonl`` (one
point per epoch; drawn as inline SVG line charts by the page), ``curves.png`` when present, and the
evaluation image grids per epoch: ``eval-epoch-NNNNNN.png`` in the folder and any PNG under an ``eval*``
sub-folder (epoch read from the first number in the file name)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from .images import ImageStore

__all__ = ["is_rl_run", "rl_section", "eval_grids"]

GRID_SIZE = 1024  # grids hold many images: keep them readable


def is_rl_run(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "metrics.jsonl").is_file()


def eval_grids(run: Path) -> list[tuple[int | None, Path]]:
    """``(epoch, png)`` of the run's evaluation grids, by epoch then name."""
    run = Path(run)
    found = list(run.glob("eval-epoch-*.png"))
    for sub in sorted(p for p in run.iterdir() if p.is_dir() and p.name.lower().startswith("eval")):
        found += sorted(sub.rglob("*.png"))
    out = []
    for p in found:
        if p.name.endswith(".tmp.png"):
            continue  # a grid being written
        m = re.search(r"(\d+)", p.stem)
        out.append((int(m.group(1)) if m else None, p))
    return sorted(set(out), key=lambda t: (t[0] is None, t[0] or 0, str(t[1])))


def _series(recs: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    series: dict[str, list[list[float]]] = {}
    for r in recs:
        x = r.get("epoch")
        if not isinstance(x, (int, float)):
            continue
        for k, v in r.items():
            if k == "epoch" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            series.setdefault(k, []).append([float(x), float(v)])
    return series


def rl_section(run: Path, store: ImageStore, label: str) -> dict[str, Any]:
    run = Path(run)
    recs = []
    for lineno, line in enumerate((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{run / 'metrics.jsonl'}:{lineno}: not JSON") from None
        if isinstance(rec, dict):
            recs.append(rec)
    final = [r for r in recs if "final" in r]
    series = _series([r for r in recs if "final" not in r])
    reward = "reward (train mean; evaluation of the EMA weights dashed)"
    groups: dict[str, list[str]] = {reward: [], "loss": [], "KL / deviation": [], "time per epoch (s)": [],
                                    "other": []}
    for k in sorted(series, key=lambda k: (k.startswith("eval/"), k)):
        if (k.startswith("reward/") or k.startswith("eval/reward/")) and k.endswith("/mean"):
            groups[reward].append(k)
        elif k.endswith("_loss") or k == "loss":
            groups["loss"].append(k)
        elif k in ("kl_div", "old_kl_div", "old_deviate"):
            groups["KL / deviation"].append(k)
        elif k.startswith("time/"):
            groups["time per epoch (s)"].append(k)
        elif k in ("global_step", "world_size"):
            continue  # counters, not curves
        elif not k.startswith(("reward/", "eval/", "r/hist")):
            groups["other"].append(k)
    grids = [{"epoch": e, "name": p.relative_to(run).as_posix(), "img": store.add_path(p, size=GRID_SIZE)}
             for e, p in eval_grids(run)]
    curves = run / "curves.png"
    return {"kind": "rl", "label": label, "file": str(run), "series": series,
            "groups": {g: ks for g, ks in groups.items() if ks}, "n_epochs": len({r.get("epoch") for r in recs
                                                                                  if "final" not in r}),
            "final": final[-1] if final else None,
            "curves": store.add_path(curves, size=1600) if curves.is_file() else None, "grids": grids}
