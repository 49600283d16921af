"""Rewards for the NFT trainer: the weighted sum of rewardkit rewards (flow_grpo's "avg") with per-component
values, batch-relative composites combined over the whole epoch across processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .config import NFTConfig
from .runtime import _Dist, resolve_tiny

__all__: list[str] = []  # the trainer's internals; rewardkit.rl.trainer re-exports them

def _resolve_tiny_tree(obj: Any, root: Path, dist: "_Dist") -> Any:
    """:func:`resolve_tiny` on every string inside nested dicts / lists (a composite's ``axes[i].options``)."""
    if isinstance(obj, dict):
        return {k: _resolve_tiny_tree(v, root, dist) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve_tiny_tree(v, root, dist) for v in obj]
    return resolve_tiny(obj, root, dist)


def _tiny_reward(name: str, root: Path, dist: "_Dist") -> Any:
    """``reward_kwargs: {NAME: {tiny: true}}``: the registered reward's ``tiny(workdir)`` test instance (random
    weights, written under ``root``), for tiny recipes of rewards whose checkpoints ``tiny:<kind>`` cannot name.
    The main process writes the files first, then the others load them."""
    from ..registry import get_reward_class

    cls, workdir = get_reward_class(name), str(root / f"reward-{name}")
    reward = cls.tiny(workdir) if dist.main else None
    dist.barrier()
    return reward if reward is not None else cls.tiny(workdir)


def _batch_relative(reward: Any) -> bool:
    """A local composite whose score depends on the other samples of the call (its ``batch_relative``: z-scored
    per batch or group), or a :class:`~rewardkit.GroupReward`, which :meth:`_RewardScorer.finalize` can combine
    over the epoch."""
    from ..compose.composite import Composite

    return (isinstance(reward, Composite) and reward.batch_relative) or _is_group(reward)


def _is_group(reward: Any) -> bool:
    from ..compose.group import GroupReward

    return isinstance(reward, GroupReward)


def _load(name: str, kwargs: dict[str, Any]) -> Any:
    """``load_reward(name, **kwargs)``; a ``group:`` entry in the kwargs (``reward_kwargs.<name>.group``) wraps it
    in a :class:`~rewardkit.GroupReward` with those options (e.g. ``{mode: winrate}``: Pref-GRPO)."""
    from ..registry import load_reward

    kwargs = dict(kwargs)
    group = kwargs.pop("group", None)
    base = load_reward(name, **kwargs)
    if group is None:
        return base
    if not isinstance(group, dict):
        raise ValueError(f"reward_kwargs.{name}.group must be a mapping of GroupReward options (e.g. {{mode: "
                         f"winrate}}), got {group!r}")
    from ..compose.group import GroupReward

    return GroupReward(base, **group)


def _check_batch_relative(key: str, reward: Any) -> None:
    """Refuse the batch-relative rewards :meth:`_RewardScorer.finalize` cannot combine over the epoch (their
    statistics would silently be those of one decoded batch, or of no groups at all)."""
    from ..compose.composite import Composite

    if getattr(reward, "batch_relative", False) and not _batch_relative(reward):
        raise ValueError(f"reward {key!r} normalises over each call (e.g. a served composite), which the NFT "
                         "trainer would call once per decoded batch: use a local `composite` reward, or a "
                         "per-sample normalisation")
    if not isinstance(reward, Composite):
        return
    for name, sub in reward.rewards.items():
        if getattr(sub, "batch_relative", False):
            raise ValueError(f"reward {key!r}: its axis {name!r} normalises over each call, which would be one "
                             "decoded batch, not the epoch: only the outer composite may use normalize: batch | group")
        _check_batch_relative(f"{key}.{name}", sub)


def check_group_keys(scorer: "_RewardScorer", metadata: list[dict[str, Any]], source: str) -> None:
    """A composite with ``normalize: group`` and ``group_by: <metadata key>`` groups the samples by that field of
    their prompt rows: every row must have it (a missing key would put those samples in one group, silently)."""
    for key, reward in zip(scorer.keys, scorer.rewards):
        if key not in scorer.deferred or _is_group(reward) or reward.config.normalize != "group" \
                or reward.config.group_by == "prompt":
            continue
        field = reward.config.group_by
        missing = [i for i, m in enumerate(metadata) if field not in m]
        if missing:
            raise ValueError(f"reward {key!r} groups by the metadata field {field!r}, which {len(missing)} prompt "
                             f"row(s) of {source} lack (first: row {missing[0] + 1}); give it in every row of a "
                             ".jsonl prompt file, or use group_by: prompt")


class _RewardScorer:
    """Weighted sum of rewardkit rewards (flow_grpo's "avg" convention: a sum) with per-component values.

    A batch-relative composite (``normalize: batch | group``) is not scored per decoded batch: each batch
    records its per-axis raw scores (:meth:`Composite.axis_scores`), and :meth:`finalize` runs the composite's
    formula once over every process's samples of the epoch (:func:`rewardkit.distributed.gather_combine`), so
    its z-scores equal one call over the whole epoch, whatever the batch size or the number of processes.
    """

    def __init__(self, cfg: NFTConfig, tiny_root: Path, dist: "_Dist"):
        from ..registry import resolve_name

        self.names = [resolve_name(n) for n in cfg.rewards]  # unknown names fail before any model loads
        self.weights = [float(w) for w in cfg.rewards.values()]
        unknown = set(cfg.reward_kwargs) - set(cfg.rewards)
        if unknown:
            raise ValueError(f"reward_kwargs for rewards not in `rewards`: {sorted(unknown)}")
        self.rewards = []
        for name, raw in zip(self.names, cfg.rewards):
            if cfg.reward_kwargs.get(raw) == {"tiny": True}:  # a tiny recipe: the reward's own tiny() instance
                self.rewards.append(_tiny_reward(name, tiny_root, dist))
                continue
            kwargs = _resolve_tiny_tree(dict(cfg.reward_kwargs.get(raw, {})), tiny_root, dist)
            self.rewards.append(_load(name, kwargs))
        self.keys = list(cfg.rewards)
        for key, r in zip(self.keys, self.rewards):
            _check_batch_relative(key, r)
        self.deferred = {k for k, r in zip(self.keys, self.rewards) if _batch_relative(r)}

    def __call__(self, images: torch.Tensor, prompts: list[str],
                 metadata: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """images: float32 ``[B, 3, H, W]`` in [0, 1], the prompts and each sample's metadata (its prompt
        row) -> ``{"total": [B], "components": {name: [B]},
        "dimensions": {name.dim: [B]}, "errors": [B reasons or None], "axes": {name: AxisScores}}`` (NaN where a
        reward gave no score). A batch-relative composite's component (and so the total) is NaN here; its
        ``AxisScores`` wait in ``axes`` for :meth:`finalize`."""
        comps, dims, axes = {}, {}, {}
        errors: list[str | None] = [None] * len(prompts)
        total = torch.zeros(len(prompts), dtype=torch.float64)
        for key, w, reward in zip(self.keys, self.weights, self.rewards):
            if key in self.deferred and _is_group(reward):  # judged in finalize, with every member of its groups
                axes[key] = {"images": (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu(),
                             "prompts": list(prompts), "metadata": list(metadata or [{}] * len(prompts))}
                comps[key] = torch.full((len(prompts),), float("nan"), dtype=torch.float64)
                total = total + comps[key]
                continue
            if key in self.deferred:
                axes[key] = reward.axis_scores(images, prompts, metadata=metadata, on_error="nan")
                comps[key] = torch.full((len(prompts),), float("nan"), dtype=torch.float64)
                total = total + comps[key]
                continue
            out = reward(images, prompts, metadata=metadata, on_error="nan")
            s = out.scores.double()
            comps[key] = s
            for d, v in out.dimensions.items():
                dims[f"{key}.{d}"] = v.double()
            for i, e in enumerate(out.errors):
                if e and errors[i] is None:
                    errors[i] = f"{key}: {e}"
            total = total + w * s  # NaN propagates: a sample missing any component has no total
        return {"total": total, "components": comps, "dimensions": dims, "errors": errors, "axes": axes}

    def finalize(self, results: list[dict[str, Any]], prompt_ids: torch.Tensor) -> dict[str, Any]:
        """This process's batch results of one epoch (or evaluation), concatenated, with every batch-relative
        composite combined over all processes' samples. Collective when a composite is deferred: every process
        must call it. ``prompt_ids`` ``[n]`` (this process's, in batch order) are the groups of
        ``normalize: group`` composites grouped by prompt. Returns ``{"total": [n], "components": {name: [n]},
        "dimensions": {name.dim: [n]}, "errors": [n]}`` (float64)."""
        from ..distributed import gather_combine

        n = sum(len(r["errors"]) for r in results)
        cat = (lambda xs: torch.cat(xs)) if results else (lambda xs: torch.zeros(0, dtype=torch.float64))
        comp_keys = results[0]["components"] if results else self.keys
        comps = {k: cat([r["components"][k] for r in results]) for k in comp_keys}
        dims = {k: cat([r["dimensions"][k] for r in results]) for k in (results[0]["dimensions"] if results else [])}
        errors = [e for r in results for e in r["errors"]]
        if len(prompt_ids) != n:
            raise ValueError(f"{len(prompt_ids)} prompt ids for {n} scored samples")
        for key, reward in zip(self.keys, self.rewards):
            if key not in self.deferred:
                continue
            if _is_group(reward):  # the groups are the prompts, completed over every process (one all-gather)
                parts = [r["axes"][key] for r in results]
                images = torch.cat([p["images"] for p in parts]) if parts else torch.zeros(0, 3, 1, 1, dtype=torch.uint8)
                out = reward.score_gathered(images, [t for p in parts for t in p["prompts"]],
                                            groups=[int(p) for p in prompt_ids],
                                            metadata=[m for p in parts for m in p["metadata"]])
                comps[key] = out.scores.double()
                for i, e in enumerate(out.errors):
                    if e and errors[i] is None:
                        errors[i] = f"{key}: {e}"
                continue
            from ..compose.composite import AxisScores

            parts = [r["axes"][key] for r in results if "axes" in r and key in r["axes"]]
            if len(parts) != len(results):
                raise ValueError(f"{key}: batch results without the composite's axis scores")
            names = list(reward.rewards)
            local = AxisScores.cat(parts) if parts else AxisScores.empty(0, names, [a.name for a in reward.axes])
            by_prompt = reward.config.normalize == "group" and reward.config.group_by == "prompt"
            out = gather_combine(reward, local, local=True,
                                 group_keys=[int(p) for p in prompt_ids] if by_prompt else None)
            comps[key] = out.scores.double()
            for d, v in out.dimensions.items():
                dims[f"{key}.{d}"] = v.double()
            for i, e in enumerate(out.errors):
                if e and errors[i] is None:
                    errors[i] = f"{key}: {e}"
        if self.deferred:
            total = torch.zeros(n, dtype=torch.float64)
            for key, w in zip(self.keys, self.weights):
                total = total + w * comps[key]  # NaN propagates as in __call__
        else:
            total = cat([r["total"] for r in results])
        return {"total": total, "components": comps, "dimensions": dims, "errors": errors}


