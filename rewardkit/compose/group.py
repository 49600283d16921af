"""``GroupReward``: any reward turned into one that judges each sample against the others of its group.

GRPO-style trainers (flow_grpo, DiffusionNFT, TRL's GRPO, verl) sample a *group* of images per prompt and
normalise rewards inside the group. ``GroupReward(base, mode=...)`` gives each sample:

- ``"winrate"`` (Pref-GRPO, Wang et al. 2025): the mean of ``P(i > j)`` over the other valid members ``j`` of its
  group. For a reward whose ``compare`` is the default Bradley-Terry ``sigmoid((s_i - s_j) / T)`` the G pointwise
  scores are enough (one call of G samples). For a generative pairwise judge (UnifiedReward's pairwise templates,
  ``rational``'s pairwise mode) the ``G (G - 1) / 2`` pairs go to ``base.compare`` in **one** call, so the judge
  engine encodes each image once and prefills shared prefixes once; each pair is judged in both orders and
  averaged (``both_orders``; a judge that already does, ``compare_is_symmetric``, is asked once per pair).
  ``max_pairs`` judges a balanced random subset of the pairs per group (an estimator: docs/rl.md).
- ``"rank"``: the normalised rank ``(rank - 1) / (n - 1)`` of the base score among the group's valid members,
  ties averaged (:func:`~rewardkit.compose.group_math.normalised_rank`).
- ``"zscore"``: the hosts' group normalisation ``(s - mean_g) / (std + eps)`` (``zscore="flow_grpo"``: ddof 0,
  ``"trl"``: ddof 1; eps 1e-4; ``global_std`` as DiffusionNFT), done once, in one place.

Groups: ``reward(images, prompts, groups=[...])`` (any hashable ids), else by ``group_by`` (the prompt, or a
metadata key). A member the base cannot score is NaN + its reason and is left out of the others' statistics; a
group with fewer than two valid members is NaN + a reason for all of them (the host's NaN policy then applies).
Every score is oriented so that higher is better (a lower-is-better base is negated before ranking / z-scoring).

A ``GroupReward`` is ``batch_relative``: the base class hands it the whole call at once (never chunked), so the
groups of one call are never split. Across processes, :meth:`GroupReward.score_gathered` gathers what it needs
with one all-gather.
"""

from __future__ import annotations

import json
import math
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from ..errors import ConfigError
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from .group_math import (ZSCORE_CONVENTIONS, bt_probs, group_index, group_rank, group_zscore_host, sample_pairs,
                         winrates)

__all__ = ["GroupReward", "GroupRewardConfig", "MODES", "group_keys_of"]

MODES = ("winrate", "rank", "zscore")
_PAIRWISE = ("auto", "judge", "scores")
_ON_PAIR_ERROR = ("nan", "skip")


@dataclass
class GroupRewardConfig(RewardConfig):
    """Options of :class:`GroupReward`.

    Attributes:
        mode: ``"winrate"`` | ``"rank"`` | ``"zscore"``.
        group_by: ``"prompt"`` (default), ``"prompt+metadata"`` (the prompt and the whole metadata dict, as
            flow_grpo's prompt rows) or a metadata key; explicit ``groups=`` in the call win.
        pairwise: for ``winrate``: ``"auto"`` (the judge's own pairwise prompt when ``base.compare`` has one,
            else Bradley-Terry from the pointwise scores), ``"judge"`` or ``"scores"``.
        both_orders: judge each pair as (i, j) and (j, i) and average ``(p_ij + 1 - p_ji) / 2`` (cancels a
            position bias); ignored when the base already does (``compare_is_symmetric``) or for BT.
        max_pairs: per group, judge about this many pairs instead of all ``G (G - 1) / 2``: ``D G`` pairs,
            ``D = max(1, max_pairs // G)``, of a balanced random design in which every member meets ``2 D`` random
            opponents (:func:`~rewardkit.compose.group_math.sample_pairs`; an unbiased estimator). None: all.
        seed: seed of that design (combined with the group's key, so every process draws the same pairs).
        on_pair_error: a pair the judge could not decide: ``"nan"`` (default) makes both members NaN + the
            reason; ``"skip"`` leaves it out of their means (a member with no decided pair is still NaN).
        zscore: ``"flow_grpo"`` (ddof 0) or ``"trl"`` (ddof 1).
        eps: added to the std (None: 1e-4, both hosts' value).
        global_std: divide by the std over every valid sample of the call instead of the group's (DiffusionNFT).
    """

    mode: str = "winrate"
    group_by: str = "prompt"
    pairwise: str = "auto"
    both_orders: bool = True
    max_pairs: int | None = None
    seed: int = 0
    on_pair_error: str = "nan"
    zscore: str = "flow_grpo"
    eps: float | None = None
    global_std: bool = False


def _hashable(k: Any) -> Hashable:
    try:
        hash(k)
        return k
    except TypeError:
        return json.dumps(k, sort_keys=True, default=str)


def group_keys_of(prompts: Sequence[Any], metadata: Sequence[dict | None] | None, group_by: str) -> list[Hashable]:
    """Each sample's group key under ``group_by`` (see :class:`GroupRewardConfig`). A metadata key missing from a
    sample raises: it would silently put those samples in one group."""
    n = len(prompts)
    metas = list(metadata) if metadata is not None else [None] * n
    if group_by == "prompt":
        return [_hashable(p) for p in prompts]
    if group_by == "prompt+metadata":
        return [(p, json.dumps(m or {}, sort_keys=True, default=str)) for p, m in zip(prompts, metas)]
    missing = [i for i, m in enumerate(metas) if not m or group_by not in m]
    if missing:
        raise ValueError(f"group_by={group_by!r}: {len(missing)} sample(s) have no metadata[{group_by!r}] (first: "
                         f"sample {missing[0]}); pass groups= or group_by='prompt'")
    return [_hashable(m[group_by]) for m in metas]


def _native_pairwise(base: Reward) -> bool:
    """True when ``base.compare`` asks the model about the pair (a generative judge), not the default BT."""
    if type(base).compare is Reward.compare:
        return False
    if getattr(getattr(base, "config", None), "compare_mode", None) == "scores":  # rational's score mode
        return False
    return not (hasattr(base, "pairwise_format") and base.pairwise_format is None)  # unifiedreward's edit


class GroupReward(Reward):
    """A reward that scores each sample relative to the other members of its group (see the module docstring).

    ``GroupReward(base, mode="winrate")``; ``base`` is a :class:`~rewardkit.Reward` or a registry name (built
    with ``base_options``). Call it like any reward, optionally with ``groups=`` (one hashable id per sample).
    """

    name = "group"
    Config = GroupRewardConfig
    batch_relative = True

    def __init__(self, base: Any, config: Any = None, /, *, base_options: dict | None = None,
                 **overrides: Any) -> None:
        super().__init__(config, **overrides)
        if isinstance(base, str):
            from ..registry import load_reward

            base = load_reward(base, **dict(base_options or {}))
        elif base_options:
            raise TypeError("base_options are for a base given by registry name")
        if not isinstance(base, Reward):
            raise TypeError(f"base must be a rewardkit Reward or a registry name, got {type(base).__name__}")
        if isinstance(base, GroupReward) or getattr(base, "batch_relative", False):
            raise ConfigError("the base of a GroupReward must score each sample on its own (not batch_relative)")
        cfg = self.config
        for key, val, allowed in (("mode", cfg.mode, MODES), ("pairwise", cfg.pairwise, _PAIRWISE),
                                  ("on_pair_error", cfg.on_pair_error, _ON_PAIR_ERROR),
                                  ("zscore", cfg.zscore, tuple(ZSCORE_CONVENTIONS))):
            if val not in allowed:
                raise ConfigError(f"{key} must be one of {allowed}, got {val!r}")
        if cfg.max_pairs is not None and (isinstance(cfg.max_pairs, bool) or int(cfg.max_pairs) < 1):
            raise ConfigError(f"max_pairs must be None or >= 1, got {cfg.max_pairs!r}")
        if cfg.eps is not None and not (math.isfinite(cfg.eps) and cfg.eps >= 0):
            raise ConfigError(f"eps must be finite and >= 0, got {cfg.eps!r}")
        self.base = base
        self.judged = cfg.mode == "winrate" and (
            cfg.pairwise == "judge" or (cfg.pairwise == "auto" and _native_pairwise(base)))
        if cfg.pairwise == "judge" and not _native_pairwise(base):
            raise ConfigError(f"pairwise='judge': {base.name or type(base).__name__}'s compare has no pairwise "
                              "prompt (it is sigmoid of score differences); use pairwise='scores'")
        self.name = f"{base.name or type(base).__name__}@{cfg.mode}"
        self.tasks = base.tasks
        self.uses_prompt = base.uses_prompt
        self.scores_empty_prompt = base.scores_empty_prompt
        self.extras = base.extras
        self.score_range = (0.0, 1.0) if cfg.mode in ("winrate", "rank") else None
        self.dimensions = () if self.judged else ("base",)
        self._local = threading.local()
        self._gather_lock = threading.Lock()
        self._gather_calls = 0

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_local", None)
        state.pop("_gather_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._local = threading.local()
        self._gather_lock = threading.Lock()

    def to(self, device: Any) -> "GroupReward":
        self.base.to(device)
        self._device = self.base.device
        return self

    @classmethod
    def tiny(cls, workdir: str) -> "GroupReward":
        from ..rewards.preference import PreferenceReward

        return cls(PreferenceReward.tiny(workdir), mode="winrate")

    # ------------------------------------------------------------------ the call
    def __call__(self, images: Any, prompt: Any = None, *, groups: Sequence[Hashable] | None = None,
                 **kwargs: Any) -> RewardOutput:
        """As :meth:`Reward.__call__`, plus ``groups``: one hashable group id per sample (default: ``group_by``)."""
        if groups is None:
            return super().__call__(images, prompt, **kwargs)
        groups = [_hashable(g) for g in groups]
        self._local.groups = groups
        try:
            return super().__call__(images, prompt, **kwargs)
        finally:
            self._local.groups = None

    def _keys(self, batch: RewardBatch) -> list[Hashable]:
        explicit = getattr(self._local, "groups", None)
        if explicit is not None:
            if max(batch.indices, default=-1) >= len(explicit):
                raise ValueError(f"got {len(explicit)} group ids for a call of more samples")
            return [explicit[i] for i in batch.indices]
        return group_keys_of(batch.prompts, batch.metadata, self.config.group_by)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        return self.score_members(list(batch.images), list(batch.prompts), batch.sources, batch.metadata,
                                  self._keys(batch), labels=batch.indices, batch_size=batch.chunk_size)

    def score_members(self, images: list, prompts: list, sources: list | None, metadata: list | None,
                      keys: Sequence[Hashable], *, labels: Sequence[int] | None = None,
                      batch_size: int | None = None) -> RewardOutput:
        """The group reward of already-validated samples with their group ``keys`` (the work of one call)."""
        metas = None if not metadata or not any(metadata) else list(metadata)
        if self.judged:
            return self._judge(images, prompts, sources, metas, list(keys), labels, batch_size)
        out = self.base(images, prompts, sources=sources, metadata=metas, batch_size=batch_size, on_error="nan")
        values = self.base._compare_values(out) if self.config.mode == "winrate" else out.scores
        return self.combine_pointwise(values, out.scores, out.valid, out.errors, list(keys), labels=labels,
                                      info=out.info)

    # ------------------------------------------------------------------ pointwise modes
    def combine_pointwise(self, values: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor,
                          errors: Sequence[str | None], keys: Sequence[Hashable], *,
                          labels: Sequence[int] | None = None, info: dict | None = None) -> RewardOutput:
        """The group reward from the base's per-sample results (``values``: what ``compare`` would use; ``scores``:
        the scores). Pure: the same inputs give the same output on every process."""
        cfg, base = self.config, self.base
        n = len(keys)
        values = torch.as_tensor(values, dtype=torch.float64).reshape(-1).clone()
        ok = torch.as_tensor(valid, dtype=torch.bool).reshape(-1) & torch.isfinite(values)
        values[~ok] = float("nan")
        result = torch.full((n,), float("nan"), dtype=torch.float64)
        groups = group_index(keys)
        sizes = [0] * n
        for idx in groups.values():
            members = [i for i in idx if bool(ok[i])]
            for i in idx:
                sizes[i] = len(members)
        signed = values if base.higher_is_better else -values
        if cfg.mode == "winrate":
            for idx in groups.values():
                members = [i for i in idx if bool(ok[i])]
                if len(members) < 2:
                    continue
                pairs = sample_pairs(members, cfg.max_pairs, self._pair_seed(keys[members[0]]))
                probs = bt_probs(values, pairs, base.compare_temperature, base.higher_is_better)
                rate, _ = winrates(n, pairs, probs)
                t = torch.tensor(members)
                result[t] = rate[t]
        elif cfg.mode == "rank":
            result = group_rank(signed, list(keys))
        else:
            ddof, eps = ZSCORE_CONVENTIONS[cfg.zscore]
            result = group_zscore_host(signed, list(keys), ddof=ddof, eps=eps if cfg.eps is None else float(cfg.eps),
                                       global_std=cfg.global_std)
        errs: list[str | None] = []
        for i in range(n):
            if not bool(ok[i]):
                errs.append(errors[i] or "non-finite base score")
            elif sizes[i] < 2:
                result[i] = float("nan")
                errs.append(self._small_group(keys[i], sizes[i]))
            elif not math.isfinite(float(result[i])):
                errs.append("no group statistic (std undefined)")
            else:
                errs.append(None)
        scores_t = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
        return RewardOutput(scores=result.float(), valid=torch.tensor([e is None for e in errs]), errors=errs,
                            dimensions={"base": scores_t}, info=self._info(info),
                            details=[{"group_size": sizes[i]} for i in range(n)])

    def _small_group(self, key: Hashable, size: int) -> str:
        return (f"group {str(key)[:60]!r} has {size} valid member(s); a {self.config.mode} group reward needs at "
                "least two")

    def _pair_seed(self, key: Hashable) -> int:
        return (zlib.crc32(repr(key).encode("utf-8")) ^ int(self.config.seed)) & 0x7FFFFFFF

    def _info(self, base_info: dict | None = None, **extra: Any) -> dict[str, Any]:
        cfg = self.config
        g: dict[str, Any] = {"mode": cfg.mode, "base": self.base.name or type(self.base).__name__}
        if cfg.mode == "winrate":
            g["pairwise"] = "judge" if self.judged else "scores (Bradley-Terry)"
            g["max_pairs"] = cfg.max_pairs
        if cfg.mode == "zscore":
            g.update(zscore=cfg.zscore, global_std=cfg.global_std)
        g.update(extra)
        return {"group": g, "base": dict(base_info or {})}

    # ------------------------------------------------------------------ generative pairwise judge
    def _judge(self, images: list, prompts: list, sources: list | None, metas: list | None,
               keys: list[Hashable], labels: Sequence[int] | None, batch_size: int | None) -> RewardOutput:
        cfg, base = self.config, self.base
        n = len(keys)
        labels = list(labels) if labels is not None else list(range(n))
        groups = group_index(keys)
        pairs: list[tuple[int, int]] = []
        for idx in groups.values():
            if len(idx) >= 2:
                pairs += sample_pairs(idx, cfg.max_pairs, self._pair_seed(keys[idx[0]]))
        swap = cfg.both_orders and not base.compare_is_symmetric
        prob = torch.zeros(0, dtype=torch.float64)
        pair_err: list[str | None] = []
        info: dict = {}
        if pairs:
            a = [images[i] for i, _ in pairs]
            b = [images[j] for _, j in pairs]
            p = [prompts[i] for i, _ in pairs]
            s = None if sources is None else [sources[i] for i, _ in pairs]
            m = None if metas is None else [metas[i] for i, _ in pairs]
            if swap:  # every pair in both orders, one compare call per first image (see _ordered)
                k = len(pairs)
                probs, errs_o, out = self._ordered(pairs + [(j, i) for i, j in pairs], images, p + p,
                                                   None if s is None else s + s, None if m is None else m + m,
                                                   batch_size)
                pa, pb = probs[:k], probs[k:]
                prob = 0.5 * (pa + 1.0 - pb)
                for x in range(k):
                    ea, eb = errs_o[x], errs_o[k + x]
                    pair_err.append(None if math.isfinite(float(prob[x])) else
                                    (ea or (f"swapped order: {eb}" if eb else "non-finite probability")))
            else:
                out = base.compare(a, b, p, sources=s, metadata=m, batch_size=batch_size, on_error="nan")
                prob = out.prob_a.double()
                pair_err = [None if math.isfinite(float(v)) else (e or "non-finite probability")
                            for v, e in zip(prob.tolist(), out.errors)]
            info = out.info
        rate, count = winrates(n, pairs, prob)
        errs: list[str | None] = [None] * n
        if cfg.on_pair_error == "nan":
            for (i, j), e in zip(pairs, pair_err):
                if e is not None:
                    rate[i] = rate[j] = float("nan")
                    errs[i] = errs[i] or f"pair with sample {labels[j]}: {e}"
                    errs[j] = errs[j] or f"pair with sample {labels[i]}: {e}"
        for idx in groups.values():
            for i in idx:
                if len(idx) < 2:
                    errs[i] = self._small_group(keys[i], len(idx))
                elif errs[i] is None and not math.isfinite(float(rate[i])):
                    errs[i] = "no pair of this sample was decided by the judge"
        for i in range(n):
            if errs[i] is not None:
                rate[i] = float("nan")
        return RewardOutput(scores=rate.float(), valid=torch.tensor([e is None for e in errs]), errors=errs,
                            info=self._info(info, pairs=len(pairs), orders=2 if (swap or base.compare_is_symmetric)
                                            else 1),
                            details=[{"group_size": len(groups[keys[i]]), "pairs": int(count[i])} for i in range(n)])

    def _ordered(self, ordered: list[tuple[int, int]], images: list, prompts: list, sources: list | None,
                 metas: list | None, batch_size: int | None) -> tuple[torch.Tensor, list[str | None], Any]:
        """P(first > second) for every ordered pair, asked as one ``compare`` call per first image inside one
        judge session: the conversations of a call share their stem (the template's start and the first image),
        which the judge engine prefills once for all of them (and each image goes through the vision tower once
        per session). Returns float64 ``[K]``, K reasons (None when decided) and the last call's output."""
        base = self.base
        by_first: dict[int, list[int]] = {}
        for x, (i, _) in enumerate(ordered):
            by_first.setdefault(i, []).append(x)
        prob = torch.full((len(ordered),), float("nan"), dtype=torch.float64)
        errs: list[str | None] = [None] * len(ordered)
        out = None
        with base._call_scope():
            for i, xs in by_first.items():
                out = base.compare([images[i]] * len(xs), [images[ordered[x][1]] for x in xs],
                                   [prompts[x] for x in xs],
                                   sources=None if sources is None else [sources[x] for x in xs],
                                   metadata=None if metas is None else [metas[x] for x in xs],
                                   batch_size=batch_size, on_error="nan")
                for y, x in enumerate(xs):
                    prob[x] = float(out.prob_a[y])
                    errs[x] = None if math.isfinite(float(out.prob_a[y])) else (out.errors[y] or
                                                                                 "non-finite probability")
        return prob, errs, out

    # ------------------------------------------------------------------ across processes
    def score_gathered(self, images: Any, prompts: Any, *, groups: Sequence[Hashable], metadata: Any = None,
                       batch_size: int | None = None, process_group: Any = None) -> RewardOutput:
        """This process's samples scored with their groups completed from every process (one all-gather).

        For pointwise modes each process scores its own samples and the per-sample values are gathered; for a
        judge each process gathers the images (uint8) of every process and judges the pairs of the groups it holds
        a member of (a pair spanning two processes is judged on both). Without an initialised process group of
        more than one process this is ``self(images, prompts, groups=groups, metadata=metadata, on_error="nan")``.
        ``groups`` must be comparable across processes (e.g. the prompt string, a prompt id).
        """
        import torch.distributed as dist

        from .. import media

        raw = media.split_batch(images)
        n = len(raw)
        prompts = self._prompts(prompts, n)
        if len(groups) != n:
            raise ValueError(f"got {len(groups)} group ids for {n} samples")
        keys = [_hashable(g) for g in groups]
        metas = None if metadata is None else [dict(m or {}) for m in metadata]
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1):
            return self(raw, prompts, groups=keys, metadata=metas, batch_size=batch_size, on_error="nan")
        # Collectives must be called in the same order on every process: calls from several threads at once (a
        # host's reward thread pool) could pair one process's batch with another's. Refuse them, loudly.
        if not self._gather_lock.acquire(blocking=False):
            raise RuntimeError(f"{self.name}: score_gathered called from two threads at once; with several "
                               "processes the calls must run one at a time, in the same order on every process "
                               "(e.g. flow_grpo / DiffusionNFT: a reward executor with max_workers=1)")
        try:
            return self._gathered(raw, prompts, keys, metas, batch_size, process_group)
        finally:
            self._gather_lock.release()

    def _gathered(self, raw: list, prompts: list, keys: list, metas: list | None, batch_size: int | None,
                  process_group: Any) -> RewardOutput:
        import torch.distributed as dist

        from .. import media

        n = len(raw)
        world = dist.get_world_size(process_group)
        rank = dist.get_rank(process_group)
        self._gather_calls += 1
        gathered: list[Any] = [None] * world
        if not self.judged:
            out = self.base(raw, prompts, metadata=metas, batch_size=batch_size, on_error="nan")
            values = self.base._compare_values(out) if self.config.mode == "winrate" else out.scores
            mine = (values.double().tolist(), out.scores.double().tolist(), out.valid.tolist(), list(out.errors), keys,
                    self._gather_calls)
            dist.all_gather_object(gathered, mine, group=process_group)
            self._check_calls([g[5] for g in gathered])
            start = sum(len(g[4]) for g in gathered[:rank])
            cat = lambda k: [x for g in gathered for x in g[k]]  # noqa: E731
            full = self.combine_pointwise(torch.tensor(cat(0), dtype=torch.float64),
                                          torch.tensor(cat(1), dtype=torch.float64), torch.tensor(cat(2)), cat(3),
                                          cat(4), info=out.info)
            return _slice(full, start, start + n)
        import numpy as np

        arrays: list[Any] = []
        errors: list[str | None] = []
        for x in raw:
            try:
                arrays.append(np.asarray(media._to_pil(x).convert("RGB"), dtype=np.uint8))
                errors.append(None)
            except media._Bad as exc:
                arrays.append(None)
                errors.append(str(exc))
        dist.all_gather_object(gathered, (arrays, prompts, metas, keys, errors, self._gather_calls),
                               group=process_group)
        self._check_calls([g[5] for g in gathered])
        start = sum(len(g[3]) for g in gathered[:rank])
        all_keys = [k for g in gathered for k in g[3]]
        mine_keys = set(keys)
        pick = [i for i, k in enumerate(all_keys) if k in mine_keys]
        flat = [(arr, p, (g[2][j] if g[2] is not None else None), k, e) for g in gathered
                for j, (arr, p, k, e) in enumerate(zip(g[0], g[1], g[3], g[4]))]
        sub = [flat[i] for i in pick]
        ok = [x for x, s in enumerate(sub) if s[4] is None]
        sub_out = self([sub[x][0] for x in ok], [sub[x][1] for x in ok], groups=[sub[x][3] for x in ok],
                       metadata=None if metas is None else [sub[x][2] for x in ok], batch_size=batch_size,
                       on_error="nan")
        where = {pick[ok[y]]: y for y in range(len(ok))}
        scores = torch.full((n,), float("nan"))
        valid = torch.zeros(n, dtype=torch.bool)
        errs: list[str | None] = list(errors)
        details: list[Any] = [None] * n
        for i in range(n):
            y = where.get(start + i)
            if y is None:
                continue
            scores[i], valid[i], errs[i] = sub_out.scores[y], sub_out.valid[y], sub_out.errors[y]
            details[i] = None if sub_out.details is None else sub_out.details[y]
        return RewardOutput(scores=scores, valid=valid, errors=errs, info=sub_out.info, details=details)


    def _check_calls(self, calls: list[int]) -> None:
        if len(set(calls)) != 1:
            raise RuntimeError(f"{self.name}: the processes are at different gathered calls {calls}: every process "
                               "must call score_gathered once per batch, in the same order")


def _slice(out: RewardOutput, a: int, b: int) -> RewardOutput:
    return RewardOutput(scores=out.scores[a:b], valid=out.valid[a:b], errors=out.errors[a:b],
                        dimensions={k: v[a:b] for k, v in out.dimensions.items()}, info=dict(out.info),
                        details=None if out.details is None else out.details[a:b])
