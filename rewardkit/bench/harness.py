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

Scores are cached on disk (:mod:`rewardkit.bench.cache`), committed after every chunk. The records
(:class:`BenchResult`, :class:`Predictions`, :func:`compute_metrics`) are in :mod:`rewardkit.bench.results` and the
scoring through the cache in :mod:`rewardkit.bench.scoring`; all public names are importable from here.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import subprocess
import time
import warnings
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..reward import Reward, config_dict
from .cache import ScoreCache, default_cache_dir, pair_key, reward_fingerprint
from .data import BenchDataError, Comparison, load_comparisons
from .spec import BenchmarkSpec, get_spec
# records and scoring live beside the harness; their public names stay importable from here
from .results import RECORD_SCHEMA, BenchmarkResult, BenchResult, Predictions, compute_metrics  # noqa: F401
from .scoring import _predict_pairwise, _predict_scalar, _Scorer

__all__ = ["evaluate", "BenchResult", "BenchmarkResult", "compute_metrics", "Predictions", "check_data_dir_keys",
           "check_by_columns", "by_columns"]

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
            keys = _items_keys(rows, reward, use_sources)
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


def _items_keys(rows: Sequence[Comparison], reward: Reward, use_sources: bool) -> list[str]:
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
