"""The accuracy harness's records: :class:`BenchResult` (a run), :class:`BenchmarkResult` (one benchmark),
:class:`Predictions` (what the reward said about each comparison) and :func:`compute_metrics`.

Public names are re-exported by :mod:`rewardkit.bench.harness` (and :mod:`rewardkit.bench`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._version import __version__
from . import metrics as M
from .data import Comparison
from .spec import BenchmarkSpec, get_spec

__all__ = ["BenchResult", "BenchmarkResult", "Predictions", "compute_metrics", "RECORD_SCHEMA"]


RECORD_SCHEMA = "rewardkit.bench.result/1"


# ------------------------------------------------------------------------------------------ records
@dataclass
class BenchmarkResult:
    """Result of one benchmark: counts, metrics (with 95% CIs), breakdowns and optional per-sample rows."""

    name: str
    spec: dict[str, Any]
    primary: str | None = None
    skipped: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, M.MetricValue] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    categories: dict[str, dict[str, dict[str, M.MetricValue]]] = field(default_factory=dict)
    subsets: dict[str, dict[str, M.MetricValue]] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] | None = None
    wrong_pairs: dict[str, Any] | None = None

    @property
    def value(self) -> float | None:
        """The primary metric's value (None when skipped)."""
        if self.primary is None or self.primary not in self.metrics:
            return None
        return self.metrics[self.primary].value

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "spec": self.spec, "primary": self.primary, "skipped": self.skipped, "data": self.data,
            "counts": self.counts, "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "unavailable": self.unavailable,
            "categories": {f: {c: {k: v.to_dict() for k, v in ms.items()} for c, ms in cats.items()}
                           for f, cats in self.categories.items()},
            "subsets": {s: {k: v.to_dict() for k, v in ms.items()} for s, ms in self.subsets.items()},
            "timing": {k: round(v, 4) for k, v in self.timing.items()},
        }
        if self.samples is not None:
            d["samples"] = self.samples
        if self.wrong_pairs is not None:
            d["wrong_pairs"] = self.wrong_pairs
        return d


@dataclass
class BenchResult:
    """A whole run: the reward, versions, settings and one :class:`BenchmarkResult` per benchmark."""

    reward: dict[str, Any]
    benchmarks: dict[str, BenchmarkResult]
    settings: dict[str, Any] = field(default_factory=dict)
    rewardkit_version: str = __version__
    git_hash: str | None = None
    created: str = ""
    timing: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, name: str) -> BenchmarkResult:
        return self.benchmarks[get_spec(name).name if name not in self.benchmarks else name]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": RECORD_SCHEMA, "rewardkit_version": self.rewardkit_version, "git_hash": self.git_hash,
                "created": self.created, "reward": self.reward, "settings": self.settings,
                "timing": {k: round(v, 4) for k, v in self.timing.items()},
                "benchmarks": {k: v.to_dict() for k, v in self.benchmarks.items()}}

    def save(self, path: str | Path) -> Path:
        """Write the JSON record."""
        import json

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
        return p

    def markdown(self) -> str:
        from .report import markdown_report

        return markdown_report([self.to_dict()])


# ------------------------------------------------------------------------------------------ predictions
@dataclass
class Predictions:
    """What the reward said about each comparison of one benchmark (all arrays ``[N]``).

    ``margin`` is NaN where there is no answer; ``forward`` / ``reverse`` are MMRB2-style verdicts
    ("A" / "B" / "tie" / None), ``reverse`` as answered on the swapped presentation; ``verdict4`` holds 4-way
    answers or None; ``single`` is the forward-only margin of a pairwise judge (None for scalar rewards).
    """

    margin: np.ndarray
    forward: list[str | None]
    reverse: list[str | None]
    score_a: np.ndarray | None = None
    score_b: np.ndarray | None = None
    verdict4: list[str | None] | None = None
    single: np.ndarray | None = None


def compute_metrics(spec: BenchmarkSpec | None, rows: Sequence[Comparison], pred: Predictions, *,
                    names: Sequence[str], n_boot: int = 1000, seed: int = 0) -> dict[str, M.MetricValue]:
    """Every metric in ``names`` on ``rows`` with a percentile-bootstrap 95% CI (``n_boot`` resamples of
    rows, or of groups for group accuracy; the tie threshold is re-fitted on every resample)."""
    h = np.array([c.label for c in rows], dtype=np.int64)
    m = pred.margin
    chosen = ["A" if c.label > 0 else "B" if c.label < 0 else "tie" for c in rows]
    out: dict[str, M.MetricValue] = {}
    for name in names:
        units: tuple[np.ndarray, np.ndarray] | None = None
        if name == "accuracy_without_ties":
            value = M.accuracy_without_ties(h, m)
            units = M.ratio_units(name, h=h, m=m)
        elif name == "single_order_accuracy":
            value = M.accuracy_without_ties(h, pred.single)
            units = M.ratio_units("accuracy_without_ties", h=h, m=pred.single)
        elif name == "accuracy_with_ties":
            value = M.accuracy_with_ties(h, m)
            value.ci = M.bootstrap_ties_ci(h, m, n_boot=n_boot, seed=seed)
        elif name == "mmrb2_official":
            value = M.mmrb2_official(chosen, pred.forward, pred.reverse)
            units = M.ratio_units(name, chosen=chosen, forward=pred.forward, reverse=pred.reverse)
        elif name == "genaibench_4way":
            votes = [c.raw_label for c in rows]
            value = M.genaibench_4way(votes, pred.verdict4)
            units = M.ratio_units(name, votes=votes, verdicts=pred.verdict4)
        elif name == "order_agreement":
            value = M.order_agreement(pred.forward, pred.reverse)
            units = M.ratio_units(name, forward=pred.forward, reverse=pred.reverse)
        elif name == "group_accuracy":
            gids = [c.group_id for c in rows]
            value = M.group_accuracy(gids, h, m)
            row_ok = np.where(h == 0, m == 0, np.sign(m) == h)
            valid = np.isfinite(m)
            by: dict[str, list[int]] = {}
            for i, g in enumerate(gids):
                by.setdefault(g, []).append(i)
            den = np.array([float(valid[ix].all()) for ix in by.values()])
            num = np.array([float(valid[ix].all() and row_ok[ix].all()) for ix in by.values()])
            units = (num, den)
        else:
            raise ValueError(f"unknown metric {name!r}")
        if units is not None:
            value.ci = M.bootstrap_ratio_ci(*units, n_boot=n_boot, seed=seed)
        out[name] = value
    return out
