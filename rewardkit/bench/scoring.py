"""The accuracy harness's scoring: queries a reward through the score cache (:class:`_Scorer`) and turns its
answers into :class:`~rewardkit.bench.results.Predictions`, in ``scalar`` or ``pairwise`` mode (see
:mod:`rewardkit.bench.harness`).
"""

from __future__ import annotations

import inspect
import sys
import time
from collections import Counter
from typing import Any, Mapping

import numpy as np

from ..distributed import merge_rows, shard_keys, sum_over_ranks
from ..judges.policy import JUDGE_FAILURE_PREFIX
from ..reward import Reward
from . import metrics as M
from .cache import ScoreCache, pair_key, sample_key
from .data import Comparison
from .results import Predictions


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
