"""The accuracy harness: ``evaluate(reward, benchmarks) -> BenchResult``.

Two ways to query a reward:

- ``scalar`` (default for rewards that do not override ``compare``): every distinct (image, prompt,
  sources) is scored once, even when it appears in several comparisons; margins are ``s_A - s_B``.
- ``pairwise`` (default for rewards that override ``compare``, i.e. judges): every comparison goes through
  ``compare`` twice, in the original and in the swapped order (MMRB2's protocol); the margin is
  ``(P_fwd(A) + 1 - P_rev(B first)) / 2 - 0.5``.

Judges that can answer "tie" / "both bad" may implement ``judge_4way(images_a, images_b, prompts, *,
sources=None) -> list[str | None]`` (answers such as "A>B", "B>A", "A=B=Good", "A=B=Bad", None when
unparsed); the harness then reports GenAI-Bench's official 4-way accuracy.

Scores are cached on disk (:mod:`rewardkit.bench.cache`), committed after every chunk.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import json
import math
import subprocess
import sys
import time
import warnings
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._version import __version__
from ..reward import Reward, config_dict
from . import metrics as M
from ..distributed import merge_rows, shard_keys, sum_over_ranks
from ..judges.policy import JUDGE_FAILURE_PREFIX
from .cache import ScoreCache, default_cache_dir, pair_key, reward_fingerprint, sample_key
from .data import BenchDataError, Comparison, load_comparisons
from .spec import BenchmarkSpec, get_spec

__all__ = ["evaluate", "BenchResult", "BenchmarkResult", "compute_metrics", "Predictions", "check_data_dir_keys",
           "check_by_columns", "by_columns"]

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


# ------------------------------------------------------------------------------------------ scoring
class _Scorer:
    """Queries the reward (through the cache) and times it."""

    def __init__(self, reward: Reward, cache: ScoreCache, *, batch_size: int, progress: bool,
                 retry_invalid: bool):
        self.reward = reward
        self.cache = cache
        self.batch_size = batch_size
        self.progress = progress
        self.retry_invalid = retry_invalid
        self.model_seconds = 0.0
        self.n_computed = 0
        self.n_cached = 0

    def _bar(self, total: int, desc: str):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="item", disable=not self.progress or total == 0,
                    file=sys.stderr, dynamic_ncols=True, smoothing=0.1)

    def _todo(self, keys: list[str], found: Mapping[str, tuple]) -> list[str]:
        self.n_cached += sum(1 for k in keys if k in found and (found[k][1] or not self.retry_invalid))
        return [k for k in keys if k not in found or (self.retry_invalid and not found[k][1])]

    def _fill(self, keys: list[str], found: dict[str, tuple], compute, put, desc: str) -> dict[str, tuple]:
        """Compute the missing (or, with ``retry_invalid``, invalid) keys in chunks; each chunk's rows
        ``(key, value, valid, error)`` are committed to the cache before the next chunk starts."""
        cached0 = self.n_cached
        todo = self._todo(shard_keys(keys, self.batch_size), found)  # under torchrun: this rank's chunks
        bar = self._bar(len(todo), desc)
        mine = []
        try:
            for s in range(0, len(todo), self.batch_size):
                chunk = todo[s:s + self.batch_size]
                t0 = time.perf_counter()
                rows = compute(chunk)
                self.model_seconds += time.perf_counter() - t0
                # A failed judge call (server down, timeout) is not an answer: report it, never cache it, so
                # the next run asks again (an invalid answer the judge did give is cached like any score).
                put([r for r in rows if r[2] or not str(r[3] or "").startswith(JUDGE_FAILURE_PREFIX)])
                found.update({k: (x, v, e) for k, x, v, e in rows})
                mine.extend(rows)
                self.n_computed += len(chunk)
                bar.update(len(chunk))
        finally:
            bar.close()
        self.n_computed += merge_rows(found, mine) - len(mine)  # every rank's rows (no-op in one process)
        self.n_cached = cached0 + sum_over_ranks(self.n_cached - cached0)
        return found

    def scores(self, samples: dict[str, tuple[bytes, str | None, list[bytes]]], use_sources: bool, desc: str
               ) -> dict[str, tuple[float, bool, str | None]]:
        def compute(chunk):
            out = self.reward([samples[k][0] for k in chunk], [samples[k][1] for k in chunk],
                              sources=[samples[k][2] for k in chunk] if use_sources else None,
                              batch_size=self.batch_size, on_error="nan")
            return [(k, float(out.scores[i]), bool(out.valid[i]), out.errors[i]) for i, k in enumerate(chunk)]

        keys = list(samples)
        return self._fill(keys, self.cache.get_scores(keys), compute, self.cache.put_scores, desc)

    def pairs(self, pairs: dict[str, tuple[bytes, bytes, str | None, list[bytes]]], use_sources: bool, desc: str
              ) -> dict[str, tuple[float, bool, str | None]]:
        def compute(chunk):
            out = self.reward.compare([pairs[k][0] for k in chunk], [pairs[k][1] for k in chunk],
                                      [pairs[k][2] for k in chunk],
                                      sources=[pairs[k][3] for k in chunk] if use_sources else None,
                                      batch_size=self.batch_size, on_error="nan")
            return [(k, float(out.prob_a[i]), bool(out.valid[i]), out.errors[i]) for i, k in enumerate(chunk)]

        keys = list(pairs)
        return self._fill(keys, self.cache.get_pairs(keys), compute, self.cache.put_pairs, desc)

    def verdicts4(self, pairs: dict[str, tuple[bytes, bytes, str | None, list[bytes]]], use_sources: bool,
                  desc: str) -> dict[str, tuple[str | None, str | None]]:
        keys = list(pairs)
        found = self.cache.get_verdicts(keys)
        todo = [k for k in shard_keys(keys, self.batch_size)
                if k not in found or (self.retry_invalid and found[k][0] is None)]
        bar = self._bar(len(todo), desc)
        mine = []
        try:
            takes_reasons = "reasons" in inspect.signature(self.reward.judge_4way).parameters
        except (TypeError, ValueError):
            takes_reasons = False
        try:
            for s in range(0, len(todo), self.batch_size):
                chunk = todo[s:s + self.batch_size]
                t0 = time.perf_counter()
                why: list = []
                extra = {"reasons": why} if takes_reasons else {}
                answers = self.reward.judge_4way([pairs[k][0] for k in chunk], [pairs[k][1] for k in chunk],
                                                 [pairs[k][2] for k in chunk],
                                                 sources=[pairs[k][3] for k in chunk] if use_sources else None,
                                                 **extra)
                self.model_seconds += time.perf_counter() - t0
                if len(answers) != len(chunk):
                    raise RuntimeError(f"judge_4way returned {len(answers)} answers for {len(chunk)} pairs")
                if len(why) != len(chunk):
                    why = [None] * len(chunk)
                rows = [(k, a, None if a else (w or "no verdict")) for k, a, w in zip(chunk, answers, why)]
                # a failed judge call is not an answer: not cached, asked again next run
                self.cache.put_verdicts([r for r in rows if r[1] or not str(r[2]).startswith(JUDGE_FAILURE_PREFIX)])
                found.update({k: (a, e) for k, a, e in rows})
                mine.extend(rows)
                bar.update(len(chunk))
        finally:
            bar.close()
        merge_rows(found, mine)
        return found


def _predict_scalar(scorer: _Scorer, rows: list[Comparison], use_sources: bool, higher_is_better: bool,
                    desc: str) -> tuple[Predictions, dict[str, Any]]:
    uses_prompt = scorer.reward.uses_prompt
    samples: dict[str, tuple[bytes, str | None, list[bytes]]] = {}
    side_keys: list[tuple[str, str]] = []
    for c in rows:
        src = c.sources if use_sources else []
        src_h = c.source_hashes if use_sources else []
        prompt = c.prompt if uses_prompt else None
        ks = []
        for img, hsh in ((c.image_a, c.hash_a), (c.image_b, c.hash_b)):
            k = sample_key(hsh, prompt, src_h)
            samples.setdefault(k, (img, c.prompt, src))
            ks.append(k)
        side_keys.append((ks[0], ks[1]))
    before = scorer.n_computed
    found = scorer.scores(samples, use_sources, desc)
    sa = np.array([found[a][0] if found[a][1] else np.nan for a, _ in side_keys], dtype=np.float64)
    sb = np.array([found[b][0] if found[b][1] else np.nan for _, b in side_keys], dtype=np.float64)
    m = (sa - sb) if higher_is_better else (sb - sa)
    fwd = [M.verdict_from_margin(x) for x in m]
    rev = [M.flip_verdict(v) for v in fwd]  # a scalar reward answers the swapped pair consistently
    errors = Counter(found[k][2] for k in samples if not found[k][1])
    info = {"n_unique_samples": len(samples), "n_scored_now": scorer.n_computed - before,
            "n_invalid_samples": sum(errors.values()),
            "invalid_reasons": dict(errors.most_common(5))}
    return Predictions(margin=m, forward=fwd, reverse=rev, score_a=sa, score_b=sb), info


def _pair_items(rows: list[Comparison], use_sources: bool, uses_prompt: bool, symmetric: bool = False
                ) -> tuple[dict[str, tuple], list[tuple[str, str]]]:
    items: dict[str, tuple] = {}
    keys = []
    for c in rows:
        src = c.sources if use_sources else []
        src_h = c.source_hashes if use_sources else []
        ha, hb = c.hash_a, c.hash_b
        prompt = c.prompt if uses_prompt else None
        kf, kr = pair_key(ha, hb, prompt, src_h), pair_key(hb, ha, prompt, src_h)
        items.setdefault(kf, (c.image_a, c.image_b, c.prompt, src))
        if not symmetric:
            items.setdefault(kr, (c.image_b, c.image_a, c.prompt, src))
        keys.append((kf, kr))
    return items, keys


def _predict_pairwise(scorer: _Scorer, rows: list[Comparison], use_sources: bool, desc: str
                      ) -> tuple[Predictions, dict[str, Any]]:
    # A judge that already averages both orders inside compare() may declare compare_is_symmetric = True:
    # the swapped call would only repeat it (P_rev = 1 - P_fwd), so it is not made.
    symmetric = bool(getattr(scorer.reward, "compare_is_symmetric", False))
    items, keys = _pair_items(rows, use_sources, scorer.reward.uses_prompt, symmetric)
    before = scorer.n_computed
    found = scorer.pairs(items, use_sources, desc)
    pf = np.array([found[f][0] if found[f][1] else np.nan for f, _ in keys], dtype=np.float64)
    if symmetric:
        pr = 1.0 - pf
    else:
        pr = np.array([found[r][0] if found[r][1] else np.nan for _, r in keys], dtype=np.float64)
    # P(A better) from each order; average what is available
    both = np.stack([pf, 1.0 - pr])
    cnt = np.isfinite(both).sum(0)
    m = np.where(cnt > 0, np.nansum(both, 0) / np.maximum(cnt, 1) - 0.5, np.nan)
    fwd = [M.verdict_from_margin(x - 0.5) for x in pf]
    rev = [M.verdict_from_margin(x - 0.5) for x in pr]  # as answered on the swapped presentation
    errors = Counter(found[k][2] for k in items if not found[k][1])
    info = {"n_unique_pairs": len(items), "n_scored_now": scorer.n_computed - before, "symmetric_compare": symmetric,
            "n_invalid_judgements": sum(errors.values()), "invalid_reasons": dict(errors.most_common(5))}
    return Predictions(margin=m, forward=fwd, reverse=rev, single=pf - 0.5), info


# ------------------------------------------------------------------------------------------ helpers
def _git_hash() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def check_data_dir_keys(data_dir: Any, specs: Sequence[BenchmarkSpec]) -> None:
    """A ``NAME=DIR`` mapping's keys must each name one of ``specs`` (its name or family): a typo would
    otherwise send that benchmark to the hub silently. :class:`BenchDataError` lists the valid keys."""
    if not isinstance(data_dir, Mapping):
        return
    valid = sorted({s.name for s in specs} | {s.family for s in specs})
    bad = [k for k in data_dir if k not in valid]
    if bad:
        raise BenchDataError(f"--data-dir / data_dir key(s) {', '.join(map(repr, bad))} match no benchmark of this "
                             f"run; valid keys: {', '.join(valid)}")


def by_columns(rows: Sequence[Comparison], by: Sequence[str]) -> tuple[set[str], set[str]]:
    """``(found, columns)``: which ``by`` names (``col`` or ``col.key``) the rows have (some row has a value
    there), and the columns there are."""
    import dataclasses

    attrs = {f.name for f in dataclasses.fields(Comparison)
             if f.name not in ("image_a", "image_b", "sources", "extra", "hash_a", "hash_b", "source_hashes")}
    cols = {k for c in rows for k in c.extra} | attrs
    found = {name for name in by if name.partition(".")[0] in cols
             and any(_category_value(c, name) != "<none>" for c in rows)}
    return found, cols


def check_by_columns(missing: Sequence[str], columns: set[str], benches: Sequence[str]) -> None:
    """A ``by`` column that no benchmark of the run has is a typo: :class:`BenchDataError` with the columns
    there are (a column only some benchmarks have is fine: the others report one "<none>" category)."""
    if missing:
        raise BenchDataError(f"--by / by: {', '.join(map(repr, sorted(missing)))} is in none of {', '.join(benches)}; "
                             f"columns: {', '.join(sorted(columns))} (a JSON-string column's key as COLUMN.KEY)")


def _data_path(data_dir: Any, spec: BenchmarkSpec) -> Path | None:
    if data_dir is None:
        return None
    if isinstance(data_dir, Mapping):
        for key in (spec.name, spec.family):
            if key in data_dir and data_dir[key] is not None:
                return Path(data_dir[key])
        return None
    root = Path(data_dir)
    return root / spec.family if (root / spec.family).is_dir() else root


def _category_value(c: Comparison, fieldname: str) -> str:
    """A comparison's value of a column; ``"col.key"`` reads a key of a JSON-string or dict column
    (e.g. MMRB2's ``prompt_metadata.category``)."""
    head, _, key = fieldname.partition(".")
    v = c.extra[head] if head in c.extra else getattr(c, head, None)
    if key:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                v = None
        v = v.get(key) if isinstance(v, dict) else None
    return "<none>" if v is None else str(v)


def _resolve_mode(reward: Reward, mode: str, probe: Comparison | None = None, use_sources: bool = False
                  ) -> tuple[str, str]:
    """``(mode, reason)``. ``auto``: scalar unless the reward's ``compare`` is native pairwise.

    A ``compare`` override that is still derived from scores (it fills ``PairwiseOutput.scores_a``, as the
    contract documents) is scalar: scoring each image once is cheaper and gives the same margins. That is
    checked on one probe comparison.
    """
    if mode not in ("auto", "scalar", "pairwise"):
        raise ValueError(f"mode must be auto, scalar or pairwise, got {mode!r}")
    if mode != "auto":
        return mode, "requested"
    if type(reward).compare is Reward.compare:
        return "scalar", "compare() is derived from scores"
    if probe is None:
        return "pairwise", "compare() is overridden"
    try:
        out = reward.compare([probe.image_a], [probe.image_b], [probe.prompt],
                             sources=[probe.sources] if use_sources else None, on_error="nan")
    except Exception as exc:  # the probe must not decide silently: say why pairwise was chosen
        return "pairwise", f"compare() is overridden (probe failed: {type(exc).__name__}: {exc})"
    if out.scores_a is not None:
        return "scalar", "compare() is overridden but derived from scores (it returns scores_a/scores_b)"
    return "pairwise", "compare() is native pairwise (no scores_a/scores_b)"


def _label_counts(rows: Sequence[Comparison]) -> dict[str, int]:
    c = Counter("a" if r.label > 0 else "b" if r.label < 0 else (f"tie_{r.tie_kind}" if r.tie_kind else "tie")
                for r in rows)
    return dict(sorted(c.items()))


# ------------------------------------------------------------------------------------------ evaluate
def evaluate(
    reward: Reward | str,
    benchmarks: str | Sequence[str | BenchmarkSpec],
    *,
    data_dir: str | Path | Mapping[str, str | Path] | None = None,
    cache_dir: str | Path | None = "default",
    batch_size: int | None = None,
    limit: int | None = None,
    mode: str = "auto",
    n_boot: int = 1000,
    seed: int = 0,
    per_sample: bool = False,
    ignore_sources: bool = False,
    retry_invalid: bool = False,
    by: Sequence[str] = (),
    revision: str | None = None,
    progress: bool = True,
    wrong_examples: int = 8,
    reward_kwargs: Mapping[str, Any] | None = None,
) -> BenchResult:
    """Measure ``reward``'s agreement with human preferences on ``benchmarks``.

    Args:
        reward: a :class:`Reward` or a registry name (built with ``reward_kwargs``).
        benchmarks: names (``"mmrb2/t2i,genaibench/edit"`` or a list; see ``rewardkit bench --list``),
            spec objects or paths to spec YAML files.
        data_dir: where local data lives: one directory (holding the dataset's files, or one sub-folder per
            benchmark family: ``mmrb2/``, ``genaibench/``, ``editreward/``), or a mapping from benchmark or
            family name to a directory; None (or a benchmark missing from the mapping) loads from the hub.
        cache_dir: score cache root; ``"default"`` = :func:`~rewardkit.bench.cache.default_cache_dir`,
            None = in memory only (nothing survives the call).
        batch_size: items per reward call (default: the reward's ``default_batch_size`` or 32); the cache
            is committed after each.
        limit: keep the first ``limit`` comparisons of each benchmark (smoke runs).
        mode: ``"scalar"``, ``"pairwise"`` or ``"auto"``: pairwise iff the reward overrides ``compare`` with
            a native pairwise judgement (one probe call checks that the override does not return
            ``scores_a``, i.e. is not derived from scores).
        n_boot: bootstrap resamples for the 95% CIs (0 disables them).
        per_sample: keep each comparison's scores and verdicts in the record.
        ignore_sources: score editing benchmarks with a reward that takes no source images (text-image
            rewards such as CLIPScore), using the instruction as the prompt; otherwise they are skipped.
        retry_invalid: re-query cached samples whose score was invalid (e.g. after a transient failure).
        by: extra per-category breakdowns by a column (e.g. ``model_a``) besides the spec's categories.
        revision: hub dataset revision (commit / tag) to pin.
        progress: progress bars with ETA on stderr.
        wrong_examples: keep this many of the pairs the reward got wrong (the most confident mistakes, largest
            ``|margin|`` first) in the record's ``wrong_pairs``, with 192-pixel thumbnails of both images and
            the sources, for ``rewardkit view`` (0: none).
    """
    t_start = time.perf_counter()
    if isinstance(reward, str):
        from ..registry import load_reward

        reward_name = reward
        reward = load_reward(reward, **dict(reward_kwargs or {}))
    else:
        reward_name = reward.name or type(reward).__name__
    if isinstance(benchmarks, str):
        benchmarks = [b for b in benchmarks.split(",") if b.strip()]
    specs = list({s.name: s for s in (get_spec(b) for b in benchmarks)}.values())  # de-duplicated, in order
    if not specs:
        raise ValueError("no benchmarks given")
    if limit is not None and limit < 1:
        raise ValueError("limit must be >= 1")
    if not isinstance(wrong_examples, int) or wrong_examples < 0:
        raise ValueError(f"wrong_examples must be an int >= 0, got {wrong_examples!r}")
    if not isinstance(n_boot, int) or n_boot < 0:
        raise ValueError(f"n_boot must be an int >= 0 (0: no confidence intervals), got {n_boot!r}")
    check_data_dir_keys(data_dir, specs)
    if revision and data_dir is not None and all(_data_path(data_dir, s) is not None for s in specs):
        raise ValueError("revision pins the hub dataset, but every benchmark reads local files (data_dir), so it "
                         "would be ignored; drop one of the two")
    requested_mode = mode
    mode, mode_reason = _resolve_mode(reward, mode)  # re-checked on the first loaded comparison
    cfg = config_dict(reward)
    cls = f"{type(reward).__module__}:{type(reward).__qualname__}"
    root = default_cache_dir() if cache_dir == "default" else cache_dir
    # the content of the weights / files the config names, the judge and the templates are part of the key
    fp = reward_fingerprint(reward_name, cls, cfg, reward=reward, memo_dir=root)
    bs = batch_size or reward.default_batch_size or 32
    reward_info = {"name": reward_name, "class": cls, "config": cfg, "higher_is_better": reward.higher_is_better,
                   "tasks": sorted(reward.tasks), "mode": mode, "mode_reason": mode_reason, "fingerprint": fp,
                   # the cache refuses rows read back outside the reward's declared range
                   "score_range": None if reward.score_range is None else list(reward.score_range)}
    results: dict[str, BenchmarkResult] = {}
    # Load (read + hash) the next benchmark in a background thread while the reward scores the current one:
    # parquet reading and hashing release the GIL, so data loading overlaps model time.
    skips = {s.name: _skip_reason(s, reward, ignore_sources) for s in specs}
    to_load = [s for s in specs if skips[s.name] is None]
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewardkit-bench-load")
    futures: dict[str, Future] = {}

    def prefetch(k: int) -> None:
        if k < len(to_load) and to_load[k].name not in futures:
            s = to_load[k]
            futures[s.name] = pool.submit(_timed_load, s, _data_path(data_dir, s), revision, limit)

    by_seen: set[str] = set()
    by_cols: set[str] = set()
    prefetch(0)  # start reading before the cache opens
    try:
        with ScoreCache(root, reward_name, fp, describe=reward_info) as cache:
            scorer = _Scorer(reward, cache, batch_size=bs, progress=progress, retry_invalid=retry_invalid)
            for spec in specs:
                if skips[spec.name] is not None:
                    results[spec.name] = BenchmarkResult(name=spec.name, spec=spec.identity(),
                                                         skipped=skips[spec.name])
                    continue
                k = next(i for i, s in enumerate(to_load) if s.name == spec.name)
                prefetch(k + 1)  # queued now: it starts the moment this one is read
                t0 = time.perf_counter()
                rows, info, load_s = futures.pop(spec.name).result()
                wait_s = time.perf_counter() - t0
                user_by = [b for b in by if b not in spec.categories]
                found_by, cols = by_columns(rows, user_by)
                by_seen |= found_by
                by_cols |= cols
                if len(to_load) == 1:  # the only data of the run: a typo is known before any scoring
                    check_by_columns(sorted(set(user_by) - found_by), cols, [spec.name])
                use_sources = spec.task == "edit" and reward.accepts_sources
                if requested_mode == "auto" and mode == "pairwise" and mode_reason == "compare() is overridden":
                    mode, mode_reason = _resolve_mode(reward, "auto", rows[0], use_sources)
                    reward_info.update(mode=mode, mode_reason=mode_reason)
                results[spec.name] = _evaluate_one(
                    spec, reward, scorer, rows=rows, info=info, mode=mode, n_boot=n_boot, seed=seed,
                    per_sample=per_sample, use_sources=use_sources, by=by, wrong_examples=wrong_examples)
                results[spec.name].timing.update({"load_s": load_s, "load_wait_s": wait_s})
                del rows
            cache_path = str(cache.path) if cache.path else None
    finally:
        for f in futures.values():
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
    if to_load:  # several benchmarks: a column none of them has is a typo (the scores stay cached)
        check_by_columns(sorted({b for b in by if not any(b in s.categories for s in to_load)} - by_seen), by_cols,
                         [s.name for s in to_load])
    total = time.perf_counter() - t_start
    settings = {"benchmarks": [s.name for s in specs], "limit": limit, "n_boot": n_boot, "seed": seed,
                "batch_size": bs, "ignore_sources": ignore_sources, "cache": cache_path, "revision": revision,
                "data_dir": None if data_dir is None else (
                    {k: str(v) for k, v in data_dir.items()} if isinstance(data_dir, Mapping) else str(data_dir))}
    return BenchResult(reward=reward_info, benchmarks=results, settings=settings, git_hash=_git_hash(),
                       created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       timing={"total_s": total, "reward_s": scorer.model_seconds,
                               "harness_s": total - scorer.model_seconds})


def _skip_reason(spec: BenchmarkSpec, reward: Reward, ignore_sources: bool) -> str | None:
    edit = spec.task == "edit"
    if edit and not reward.accepts_sources and not ignore_sources:
        return (f"reward takes no source images (tasks: {', '.join(sorted(reward.tasks))}); "
                "pass ignore_sources=True / --ignore-sources to score edits from the instruction alone")
    if not edit and reward.requires_sources:
        return f"reward needs source images (tasks: {', '.join(sorted(reward.tasks))}); {spec.name} is t2i"
    return None


def _timed_load(spec: BenchmarkSpec, data_dir: Path | None, revision: str | None, limit: int | None):
    t0 = time.perf_counter()
    rows, info = load_comparisons(spec, data_dir, revision=revision, limit=limit)
    return rows, info, time.perf_counter() - t0


def _evaluate_one(spec: BenchmarkSpec, reward: Reward, scorer: _Scorer, *, rows: list[Comparison],
                  info: dict[str, Any], mode: str, n_boot: int, seed: int, per_sample: bool, use_sources: bool,
                  by: Sequence[str], wrong_examples: int = 0) -> BenchmarkResult:
    res = BenchmarkResult(name=spec.name, spec=spec.identity())
    res.data = info
    model_before = scorer.model_seconds
    desc = f"{spec.name} ({mode})"
    if mode == "scalar":
        pred, pinfo = _predict_scalar(scorer, rows, use_sources, reward.higher_is_better, desc)
    else:
        pred, pinfo = _predict_pairwise(scorer, rows, use_sources, desc)
    names = list(spec.metrics)
    if mode == "pairwise":
        names += ["order_agreement", "single_order_accuracy"]
    if "genaibench_4way" in names:
        if callable(getattr(reward, "judge_4way", None)):
            keys = items_keys(rows, reward, use_sources)
            items = {k: (c.image_a, c.image_b, c.prompt, c.sources if use_sources else [])
                     for k, c in zip(keys, rows)}
            found = scorer.verdicts4(items, use_sources, f"{spec.name} (4-way)")
            pred.verdict4 = [found[k][0] for k in keys]
        else:
            names.remove("genaibench_4way")
            res.unavailable["genaibench_4way"] = ("needs a judge that answers tie / both-bad "
                                                  "(a judge_4way method); scalar rewards cannot")
    res.primary = next((p for p in spec.primary if p in names), None)
    t1 = time.perf_counter()
    res.metrics = compute_metrics(spec, rows, pred, names=names, n_boot=n_boot, seed=seed)
    for field_name in [*spec.categories, *[b for b in by if b not in spec.categories]]:
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(rows):
            groups.setdefault(_category_value(c, field_name), []).append(i)
        res.categories[field_name] = {
            v: compute_metrics(spec, [rows[i] for i in idx], _subset(pred, idx), names=names, n_boot=n_boot, seed=seed)
            for v, idx in sorted(groups.items())}
    for sub in spec.subsets:
        if sub == "single_source":
            idx = [i for i, c in enumerate(rows) if len(c.sources) == 1]
            if idx:
                res.subsets[sub] = compute_metrics(spec, [rows[i] for i in idx], _subset(pred, idx), names=names,
                                                   n_boot=n_boot, seed=seed)
    t_metrics = time.perf_counter() - t1
    res.counts = {"n_comparisons": len(rows), "n_groups": len({c.group_id for c in rows}),
                  "labels": _label_counts(rows), **pinfo,
                  "n_multi_image_responses": sum(c.n_images_a > 1 or c.n_images_b > 1 for c in rows)}
    if spec.subsets:
        res.counts["n_single_source"] = sum(len(c.sources) == 1 for c in rows)
    if spec.group_id:
        res.counts["warnings"] = _group_warnings(rows)
        for w in res.counts["warnings"]:
            warnings.warn(f"{spec.name}: {w}", stacklevel=2)
    res.timing = {"reward_s": scorer.model_seconds - model_before, "metrics_s": t_metrics}
    if per_sample:
        res.samples = [_sample_record(c, pred, i) for i, c in enumerate(rows)]
    if wrong_examples:
        res.wrong_pairs = wrong_pairs(rows, pred, wrong_examples)
    return res


def wrong_indices(rows: Sequence[Comparison], margin: np.ndarray) -> list[int]:
    """Rows the reward got wrong under ``accuracy_without_ties``' rule: a human preference (label != 0), a
    finite margin, and ``sign(margin) != label`` (a model tie is wrong); most confident mistakes first
    (largest ``|margin|``, then row order)."""
    idx = [i for i, c in enumerate(rows)
           if c.label != 0 and math.isfinite(float(margin[i])) and np.sign(margin[i]) != c.label]
    return sorted(idx, key=lambda i: (-abs(float(margin[i])), i))


def wrong_pairs(rows: Sequence[Comparison], pred: Predictions, keep: int, thumb: int = 192) -> dict[str, Any]:
    """``{"n_wrong", "rule", "pairs"}``: how many pairs the reward got wrong and the first ``keep`` of
    :func:`wrong_indices` with their prompt, label, margin, scores, verdicts and thumbnails (data URIs) of
    image A, image B and the sources (an unreadable image is None)."""
    from ..view.images import thumbnail_data_uri

    def thumb_of(data: bytes) -> str | None:
        try:
            return thumbnail_data_uri(data, thumb)
        except Exception:  # noqa: BLE001  an undecodable image is shown as missing, the record still saves
            return None

    idx = wrong_indices(rows, pred.margin)
    pairs = []
    for i in idx[:keep]:
        c = rows[i]
        rec = _sample_record(c, pred, i)
        rec.update(prompt=c.prompt, image_a=thumb_of(c.image_a), image_b=thumb_of(c.image_b),
                   sources=[thumb_of(s) for s in c.sources])
        pairs.append(rec)
    return {"n_wrong": len(idx), "rule": "label != 0, finite margin, sign(margin) != label; largest |margin| first",
            "pairs": pairs}


def items_keys(rows: Sequence[Comparison], reward: Reward, use_sources: bool) -> list[str]:
    """Forward-order pair keys of ``rows`` (the cache keys of 4-way verdicts)."""
    return [pair_key(c.hash_a, c.hash_b, c.prompt if reward.uses_prompt else None,
                     c.source_hashes if use_sources else []) for c in rows]


def _group_warnings(rows: Sequence[Comparison]) -> list[str]:
    """Groups whose row count is not C(K, 2) for their K (``num_candidates``): a sign that the group-id rule
    (id before the first "_", UNVERIFIED for the current hub release) does not fit the data."""
    sizes: dict[str, int] = Counter(c.group_id for c in rows)
    ks = {c.group_id: c.extra.get("num_candidates") for c in rows}
    bad = [g for g, n in sizes.items() if isinstance(ks.get(g), int) and n != ks[g] * (ks[g] - 1) // 2]
    if not bad:
        return []
    return [f"{len(bad)} of {len(sizes)} groups do not have C(K,2) rows (e.g. {bad[0]!r}: {sizes[bad[0]]} rows "
            f"for K={ks[bad[0]]}); check the spec's group_id rule against the data"]


def _subset(pred: Predictions, idx: list[int]) -> Predictions:
    ix = np.asarray(idx, dtype=np.int64)
    pick = (lambda a: None if a is None else a[ix])
    pickl = (lambda a: None if a is None else [a[i] for i in idx])
    return Predictions(margin=pred.margin[ix], forward=pickl(pred.forward), reverse=pickl(pred.reverse),
                       score_a=pick(pred.score_a), score_b=pick(pred.score_b), verdict4=pickl(pred.verdict4),
                       single=pick(pred.single))


def _num(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _sample_record(c: Comparison, pred: Predictions, i: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"index": c.index, "id": c.item_id, "group": c.group_id, "label": c.label,
                           "raw_label": c.raw_label, "margin": _num(pred.margin[i]),
                           "forward": pred.forward[i], "reverse": pred.reverse[i]}
    if pred.score_a is not None:
        rec["score_a"], rec["score_b"] = _num(pred.score_a[i]), _num(pred.score_b[i])
    if pred.verdict4 is not None:
        rec["verdict4"] = pred.verdict4[i]
    return rec


__all__ += ["BenchDataError"]
