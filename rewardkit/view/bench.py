"""``rewardkit bench`` records (the JSON of :meth:`rewardkit.bench.BenchResult.save`) as a ``bench`` section:
per record and benchmark the metrics with their 95% CIs, counts, the per-category and subset breakdowns,
and the pairs the reward got wrong (``wrong_pairs``, with thumbnails, in records written since rewardkit
0.x; older records with ``--per-sample`` rows list the wrong pairs' ids without images)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .images import ImageStore

__all__ = ["is_bench_record", "bench_section"]


def is_bench_record(path: Path) -> bool:
    if Path(path).suffix.lower() != ".json":
        return False
    try:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and isinstance(rec.get("benchmarks"), dict)


def _metric(m: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(m, dict):
        return None
    out = {k: m.get(k) for k in ("value", "ci95", "n", "threshold", "individual") if m.get(k) is not None}
    notes = {k: m[k] for k in ("n_model_ties", "n_human_ties", "n_invalid", "n_missing", "n_unparsed",
                                "n_invalid_groups") if m.get(k)}
    if notes:
        out["notes"] = notes
    return out


def _wrong_from_samples(samples: list[dict[str, Any]], keep: int = 50) -> dict[str, Any]:
    """Older records: the wrong pairs from ``--per-sample`` rows (same rule as the harness; no images)."""
    bad = []
    for s in samples:
        lab, m = s.get("label"), s.get("margin")
        if lab in (1, -1) and isinstance(m, (int, float)) and math.isfinite(m) and (m > 0) - (m < 0) != lab:
            bad.append(s)
    bad.sort(key=lambda s: -abs(s["margin"]))
    return {"n_wrong": len(bad), "rule": "from --per-sample rows (no images stored)",
            "pairs": [dict(s) for s in bad[:keep]]}


def bench_section(paths: list[Path], store: ImageStore) -> dict[str, Any]:
    from ..bench.report import METRIC_LABELS, labels, load_records

    records = load_records(paths)
    names = labels(records)
    out = []
    for path, rec, name in zip(paths, records, names):
        benches = []
        for bname, br in rec["benchmarks"].items():
            b: dict[str, Any] = {"name": bname, "version": (br.get("spec") or {}).get("version"),
                                 "primary": br.get("primary"), "skipped": br.get("skipped"),
                                 "unavailable": br.get("unavailable") or {},
                                 "counts": {k: v for k, v in (br.get("counts") or {}).items()
                                            if isinstance(v, (int, float, str))},
                                 "metrics": {k: _metric(v) for k, v in (br.get("metrics") or {}).items()},
                                 "categories": {f: {c: _metric((ms or {}).get(br.get("primary")))
                                                    for c, ms in cats.items()}
                                                for f, cats in (br.get("categories") or {}).items()},
                                 "subsets": {s: _metric((ms or {}).get(br.get("primary")))
                                             for s, ms in (br.get("subsets") or {}).items()}}
            wrong = br.get("wrong_pairs")
            if wrong is None and br.get("samples"):
                wrong = _wrong_from_samples(br["samples"])
            if wrong is not None:
                pairs = []
                for j, p in enumerate(wrong.get("pairs") or []):
                    q = {k: v for k, v in p.items() if k not in ("image_a", "image_b", "sources")}
                    for side in ("a", "b"):
                        uri = p.get(f"image_{side}")
                        q[f"img_{side}"] = (None if uri is None else
                                            store.add_data_uri(uri, f"{bname} {j + 1} {side.upper()}"))
                    q["src"] = [store.add_data_uri(u, f"source {k + 1}") for k, u in enumerate(p.get("sources") or [])
                                if u]
                    pairs.append(q)
                b["wrong"] = {"n_wrong": wrong.get("n_wrong"), "rule": wrong.get("rule"), "pairs": pairs}
            benches.append(b)
        out.append({"label": name, "file": str(path), "reward": rec.get("reward", {}).get("name"),
                    "mode": rec.get("reward", {}).get("mode"), "fingerprint": rec.get("reward", {}).get("fingerprint"),
                    "version": rec.get("rewardkit_version"), "created": rec.get("created"), "benchmarks": benches})
    return {"kind": "bench", "label": ", ".join(names), "records": out, "metric_labels": METRIC_LABELS}
