"""flow_grpo / DiffusionNFT: a per-reward scorer and a ``multi_score``-compatible combined reward.

flow_grpo (``flow_grpo/rewards.py``) and DiffusionNFT (which reuses it) build rewards as::

    reward_fn = multi_score(device, {"pickscore": 1.0, "ocr": 0.5})
    future = executor.submit(reward_fn, images, prompts, prompt_metadata, only_strict=True)   # 8 threads
    rewards, reward_metadata = future.result()
    rewards = {key: torch.as_tensor(value).float() for key, value in rewards.items()}

with ``images`` a float NCHW tensor in [0, 1] (fp32, or fp16 / bf16 under autocast), ``prompts`` a tuple of
strings, ``prompt_metadata`` a tuple of dicts, and newer versions passing ``ref_images=`` for editing rewards.
The returned dict holds one score array per reward and ``"avg"``, which flow_grpo computes as the
**weighted sum** ``sum_k w_k * s_k`` (not a mean, despite its name): :func:`multi_score` matches it exactly,
so weights tuned for flow_grpo keep their meaning.

Every value of the first dict is a float32 numpy array of B per-sample scores (the host turns each into a
tensor and concatenates them per key), so call-level information (the NaN policy's valid fraction, the
reasons of invalid samples) goes into the second, ``reward_metadata`` dict.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ._common import LazyReward, _check_policy, apply_nan_policy, refuse_batch_relative

__all__ = ["flow_grpo_scorer", "flow_grpo_factory", "multi_score"]

_HOST = "flow_grpo"


def _metadata(metadata: Any, n: int) -> list | None:
    """flow_grpo passes a tuple of per-prompt dicts; its examples also pass ``{}`` for "none"."""
    if metadata is None or (isinstance(metadata, Mapping) and not metadata):
        return None
    if isinstance(metadata, Mapping):
        raise TypeError("metadata must be a sequence of per-sample dicts (flow_grpo's prompt_metadata), "
                        f"got one dict with keys {sorted(metadata)[:5]}")
    metas = list(metadata)
    return metas if any(m for m in metas) else None


def _sources(ref_images: Any) -> list | None:
    if ref_images is None:
        return None
    from .. import media

    return [[x] for x in media.split_batch(ref_images)]   # one reference image per sample


class _Scorer:
    """``fn(images, prompts, metadata) -> (scores, info)`` for one reward (see :func:`flow_grpo_scorer`)."""

    def __init__(self, handle: LazyReward, nan_policy: str, fill_value: float | None, batch_size: int | None,
                 allow_batch_relative: bool):
        self.handle = handle
        self.nan_policy = nan_policy
        self.fill_value = fill_value
        self.batch_size = batch_size
        self.allow_batch_relative = allow_batch_relative
        self.__name__ = handle.name

    def score(self, images: Any, prompts: Any, metadata: Any = None, ref_images: Any = None,
              ) -> tuple[np.ndarray, dict[str, Any]]:
        reward = self.handle.get()
        refuse_batch_relative(reward, _HOST, self.allow_batch_relative)
        if isinstance(prompts, str):
            prompts = [prompts]
        out = reward(images, list(prompts) if prompts is not None else None,
                     sources=_sources(ref_images) if reward.accepts_sources else None,
                     metadata=_metadata(metadata, 0), batch_size=self.batch_size, on_error="nan")
        values, report = apply_nan_policy(out, host=_HOST, name=self.handle.name, nan_policy=self.nan_policy,
                                          fill_value=self.fill_value)
        return np.asarray(values, dtype=np.float32), report

    def __call__(self, images: Any, prompts: Any, metadata: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        return self.score(images, prompts, metadata)


def flow_grpo_scorer(reward: Any, device: Any = None, *, nan_policy: str = "raise", fill_value: float | None = None,
                     batch_size: int | None = None, allow_batch_relative: bool = False,
                     **reward_kwargs: Any) -> Callable[..., tuple[np.ndarray, dict[str, Any]]]:
    """One rewardkit reward as a flow_grpo scorer: ``fn(images, prompts, metadata) -> (scores, info)``.

    Args:
        reward: a :class:`~rewardkit.Reward` instance or a registry name (built with ``reward_kwargs`` on
            the first call, once, behind a lock).
        device: int (CUDA ordinal), string or ``torch.device`` (flow_grpo passes ``accelerator.device``).
        nan_policy: ``"raise"`` (default): :class:`~rewardkit.integrations.NonFiniteRewardError` listing the
            invalid samples and reasons; ``"fill"``: ``fill_value`` for them, and ``info["valid_fraction"]``.
        batch_size: the reward's chunk size (default: the reward's own).
        allow_batch_relative: accept a batch-normalised composite (only correct when one call holds the
            whole normalisation batch on one process; see docs/integrations.md).

    Returns:
        a callable returning ``(float32 numpy [B], {"valid_fraction", "n_invalid", "invalid"})``.
    """
    fill = _check_policy(nan_policy, fill_value, mask_ok=False, host=_HOST)
    return _Scorer(LazyReward(reward, device, reward_kwargs), nan_policy, fill, batch_size, allow_batch_relative)


def flow_grpo_factory(reward: Any, **kwargs: Any) -> Callable[[Any], Callable]:
    """A factory for flow_grpo's ``score_functions`` table: ``score_functions["rk_pickscore"] =
    flow_grpo_factory("pickscore")``. flow_grpo passes ``device`` to a factory only when its code has a
    parameter of that name, which this one has."""

    def factory(device):
        return flow_grpo_scorer(reward, device, **kwargs)

    factory.__name__ = f"rewardkit_{reward if isinstance(reward, str) else getattr(reward, 'name', 'reward')}"
    return factory


def multi_score(device: Any, score_dict: Mapping[str, float], *, rewards: Mapping[str, Any] | None = None,
                reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None, nan_policy: str = "raise",
                fill_value: float | None = None, batch_size: int | None = None,
                allow_batch_relative: bool = False) -> Callable[..., tuple[dict[str, np.ndarray], dict[str, Any]]]:
    """A drop-in for flow_grpo's ``multi_score(device, score_dict)`` built from rewardkit rewards.

    ``fn(images, prompts, metadata, ref_images=None, only_strict=True)`` returns
    ``({name: scores, ..., "avg": sum_k w_k * scores_k}, info)``: ``"avg"`` is flow_grpo's weighted **sum**.
    ``ref_images`` (newer flow_grpo) become each editing reward's ``sources`` (one reference per sample);
    ``only_strict`` (GenEval's switch) is accepted and ignored.

    Args:
        device: as flow_grpo passes it (``accelerator.device``), or an int ordinal.
        score_dict: ``{name: weight}``; a name is a registry name unless ``rewards`` maps it to an instance.
        rewards: optional ``{name: Reward instance}``.
        reward_kwargs: optional ``{name: {option: value}}`` for rewards built by name.
        nan_policy, fill_value: as in :func:`flow_grpo_scorer`; ``"fill"`` fills each reward's invalid
            samples before the sum, and ``info[name]["valid_fraction"]`` reports them.

    Example::

        from rewardkit.integrations.flow_grpo import multi_score
        reward_fn = multi_score(accelerator.device, {"pickscore": 1.0, "clipscore": 0.5})
    """
    fill = _check_policy(nan_policy, fill_value, mask_ok=False, host=_HOST)
    if not isinstance(score_dict, Mapping) or not score_dict:
        raise ValueError("score_dict must be a non-empty {name: weight} mapping")
    if "avg" in score_dict:
        raise ValueError("'avg' is the name of the weighted sum in flow_grpo's output; rename that reward")
    rewards = dict(rewards or {})
    reward_kwargs = dict(reward_kwargs or {})
    unknown = (set(rewards) | set(reward_kwargs)) - set(score_dict)
    if unknown:
        raise ValueError(f"rewards / reward_kwargs name {sorted(unknown)}, which score_dict does not weight")
    weights: dict[str, float] = {}
    for name, w in score_dict.items():
        w = float(w)
        if not np.isfinite(w):
            raise ValueError(f"weight of {name!r} must be finite, got {w}")
        weights[name] = w
    scorers = {name: _Scorer(LazyReward(rewards.get(name, name), device, reward_kwargs.get(name)), nan_policy,
                             fill, batch_size, allow_batch_relative) for name in weights}

    def _fn(images, prompts, metadata, ref_images=None, only_strict=True):
        details: dict[str, np.ndarray] = {}
        info: dict[str, Any] = {}
        total = None
        for name, w in weights.items():
            scores, report = scorers[name].score(images, prompts, metadata, ref_images)
            details[name] = scores
            info[name] = report
            total = w * scores.astype(np.float64) if total is None else total + w * scores.astype(np.float64)
        details["avg"] = total.astype(np.float32)
        return details, info

    _fn.__name__ = "rewardkit_multi_score"
    return _fn
