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

Scales: a reward built here by a name flow_grpo knows gets flow_grpo's scale and convention by default
(:data:`FLOW_GRPO_CONVENTIONS`; e.g. PickScore divided by 26, CLIPScore as ViT-L/14 ``logits / 100``), so
``{"pickscore": 1.0, "clipscore": 1.0}`` weighs the two as flow_grpo does. ``conventions="rewardkit"`` keeps
rewardkit's own defaults; explicit ``reward_kwargs`` always win; a ``Reward`` instance is used as configured.
The host passes ``config.reward_fn``, an ``ml_collections.ConfigDict``: any object with ``.items()`` works.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..registry import REFUSED
from ._common import LazyReward, _check_policy, apply_nan_policy, is_group_reward, refuse_batch_relative

__all__ = ["flow_grpo_scorer", "flow_grpo_factory", "multi_score", "FLOW_GRPO_CONVENTIONS", "Convention",
           "CONVENTIONS"]

_HOST = "flow_grpo"
CONVENTIONS = ("flow_grpo", "rewardkit")


@dataclass(frozen=True)
class Convention:
    """How flow_grpo scores one of its reward names, as rewardkit options plus a factor on the score.

    ``kwargs`` are defaults for the reward's constructor (the caller's ``reward_kwargs`` override them);
    ``factor`` multiplies every valid score (a ``fill_value`` is already on the host's scale and is not
    multiplied); ``source`` names flow_grpo's code (NVlabs/DiffusionNFT @ 24af5554, ``flow_grpo/``)."""

    kwargs: Mapping[str, Any] = field(default_factory=dict)
    factor: float = 1.0
    source: str = ""


#: flow_grpo's scale per reward name (the table in docs/integrations.md; tests/integrations/test_flow_grpo.py
#: checks each against a transcription of flow_grpo's code). The names flow_grpo has and rewardkit cannot score
#: (``deqa``, ``video_ocr``, ``image_similarity``, ``seedscore``: :data:`_NOT_IN_REWARDKIT`) are refused with the
#: reason.
FLOW_GRPO_CONVENTIONS: dict[str, Convention] = {
    # logit_scale.exp() * cos(text, image) / 26 (pickscore_scorer.py:46-50)
    "pickscore": Convention({"scale": 1.0 / 26.0}, 1.0, "pickscore_scorer.py:46-50"),
    # CLIP ViT-L/14 logits_per_image / 100 (clip_scorer.py:37, :56): logit_scale.exp() * cos / 100
    "clipscore": Convention({"model": "openai/clip-vit-large-patch14", "convention": "logits100"}, 1.0,
                            "clip_scorer.py:37,56"),
    # HPSv2.1 normalised image . text features, i.e. the cosine (hpsv2_scorer.py:128-130): rewardkit's default
    "hpsv2": Convention({"scale": 1.0}, 1.0, "hpsv2_scorer.py:128-130"),
    # ImageReward's inference_rank: (mlp - mean) / std (imagereward_scorer.py:25): rewardkit's default
    "imagereward": Convention({"normalize": True}, 1.0, "imagereward_scorer.py:25"),
    # LAION aesthetic MLP on the normalised CLIP-L/14 image embedding, 1-10 (aesthetic_scorer.py:47-50)
    "aesthetic": Convention({}, 1.0, "aesthetic_scorer.py:47-50"),
    # 1 - min(d, |t|) / |t| on case-folded, space-free text (ocr.py:44-58): same scale; see the docs for the
    # two rule differences (flow_grpo: the first "..." span, and 1.0 whenever the target is contained)
    "ocr": Convention({"whitespace": "remove", "case_sensitive": False, "normalize_by": "target"}, 1.0,
                      "ocr.py:27,44-58"),
    # "Final Score: x" / 5 (rewards.py:250): rewardkit's score is x in [1, 5]
    "unifiedreward": Convention({"template": "t2i"}, 0.2, "rewards.py:250"),
    # -(JPEG quality-95 size in kB of 1000 bytes) / 500 (rewards.py:8-30); DDPO's is -kB (rewardkit's default)
    "jpeg-compressibility": Convention({"divisor": 500.0}, 1.0, "rewards.py:8-30"),
    # +kB (rewards.py:8-20; not in multi_score's table there, accepted here as DDPO's name)
    "jpeg-incompressibility": Convention({}, 1.0, "rewards.py:8-20"),
    # <Score>N</Score> / 5 (yifan123/flow_grpo @ ac4c86e qwenvl.py:16-24): rewardkit's score is N in [1, 5]
    "qwenvl": Convention({}, 0.2, "flow_grpo qwenvl.py:16-24"),
    # GenEval: the reward server's partial score (`scores`, what the hosts sum into "avg"; gen_eval.py:320-340),
    # with the detector fed as the hosts' servers feed it (RGB arrays that mmdet takes for BGR); the extra
    # accuracy keys come from the per-sample details (rewardkit.rewards._geneval_records.flow_grpo_geneval)
    "geneval": Convention({"form": "score", "detector_channels": "bgr"}, 1.0,
                          "rewards.py:113-160, gen_eval.py:286-340"),
}

#: flow_grpo's names rewardkit cannot score, with the reason (one table: the registry's, so that every
#: entry point, ``load_reward`` and ``rewardkit rl nft`` too, names the reason)
_NOT_IN_REWARDKIT = REFUSED

#: the key flow_grpo's multi_score gives GenEval (its extra accuracy keys are added beside it)
_GENEVAL = "geneval"


def _items(score_dict: Any) -> list[tuple[str, Any]]:
    """``(name, weight)`` pairs of a mapping or anything else with ``.items()`` (flow_grpo and DiffusionNFT pass
    ``config.reward_fn``, an ``ml_collections.ConfigDict``, which is not a ``collections.abc.Mapping``)."""
    items = getattr(score_dict, "items", None)
    if not callable(items) or isinstance(score_dict, (str, bytes)):
        raise TypeError(f"score_dict must be a {{name: weight}} mapping (a dict or an ml_collections ConfigDict), "
                        f"got {type(score_dict).__name__}")
    pairs = list(items())
    if not pairs:
        raise ValueError("score_dict must be a non-empty {name: weight} mapping")
    return pairs


def _weights(score_dict: Any) -> dict[str, float]:
    """``{name: weight}`` from ``score_dict``'s items, each weight a finite number."""
    weights: dict[str, float] = {}
    for name, w in _items(score_dict):
        name = str(name)
        if name == "avg":
            raise ValueError("'avg' is the name of the weighted sum in flow_grpo's output; rename that reward")
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise ValueError(f"weight of {name!r} must be a number, got {w!r}")
        w = float(w)
        if not np.isfinite(w):
            raise ValueError(f"weight of {name!r} must be finite, got {w}")
        weights[name] = w
    return weights


def _named(name: str, kwargs: Mapping[str, Any] | None, conventions: str) -> tuple[dict[str, Any], float]:
    """Constructor options and score factor for a reward built by name under ``conventions``."""
    if conventions not in CONVENTIONS:
        raise ValueError(f"conventions must be one of {CONVENTIONS}, got {conventions!r}")
    if name in _NOT_IN_REWARDKIT:
        raise ValueError(f"{name!r}: {_NOT_IN_REWARDKIT[name]}; keep flow_grpo's own multi_score for it, or pass "
                         f"rewards={{{name!r}: <a rewardkit Reward>}}")
    from ..registry import resolve_name

    conv = FLOW_GRPO_CONVENTIONS.get(resolve_name(name)) if conventions == "flow_grpo" else None
    if conv is None:
        return dict(kwargs or {}), 1.0
    return {**conv.kwargs, **dict(kwargs or {})}, conv.factor


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


def _group_call(reward: Any, images: Any, prompts: Any, metadata: Any, ref_images: Any, batch_size: int | None):
    """A :class:`~rewardkit.GroupReward` on flow_grpo's call: the groups are the prompt rows (the prompt and its
    metadata dict, or the reward's ``group_by`` metadata key), completed across ranks with one all-gather when a
    process group is initialised (flow_grpo / DiffusionNFT's K-repeat sampler spreads a group over ranks)."""
    from ..compose.group import group_keys_of

    if ref_images is not None:
        raise ValueError(f"{reward.name}: a group reward with ref_images (editing) is not supported by multi_score")
    prompts = list(prompts) if prompts is not None else [None] * len(images)
    metas = _metadata(metadata, 0)
    by = reward.config.group_by
    keys = group_keys_of(prompts, metas, "prompt+metadata" if by == "prompt" else by)
    return reward.score_gathered(images, prompts, groups=keys, metadata=metas, batch_size=batch_size)


class _Scorer:
    """``fn(images, prompts, metadata) -> (scores, info)`` for one reward (see :func:`flow_grpo_scorer`)."""

    def __init__(self, handle: LazyReward, nan_policy: str, fill_value: float | None, batch_size: int | None,
                 allow_batch_relative: bool, factor: float = 1.0):
        self.handle = handle
        self.factor = float(factor)
        self.nan_policy = nan_policy
        self.fill_value = fill_value
        self.batch_size = batch_size
        self.allow_batch_relative = allow_batch_relative
        self.__name__ = handle.name

    def score(self, images: Any, prompts: Any, metadata: Any = None, ref_images: Any = None,
              ) -> tuple[np.ndarray, dict[str, Any]]:
        values, report, _ = self.score_output(images, prompts, metadata, ref_images)
        return values, report

    def score_output(self, images: Any, prompts: Any, metadata: Any = None, ref_images: Any = None,
                     ) -> tuple[np.ndarray, dict[str, Any], Any]:
        """:meth:`score` and the reward's own ``RewardOutput`` (GenEval's details feed the extra keys)."""
        reward = self.handle.get()
        refuse_batch_relative(reward, _HOST, self.allow_batch_relative)
        if isinstance(prompts, str):
            prompts = [prompts]
        if is_group_reward(reward):
            out = _group_call(reward, images, prompts, metadata, ref_images, self.batch_size)
        else:
            out = reward(images, list(prompts) if prompts is not None else None,
                         sources=_sources(ref_images) if reward.accepts_sources else None,
                         metadata=_metadata(metadata, 0), batch_size=self.batch_size, on_error="nan")
        if self.factor != 1.0:   # flow_grpo's scale (before the NaN policy: a fill_value is on the host's scale)
            out = dataclasses.replace(out, scores=out.scores.double() * self.factor)
        values, report = apply_nan_policy(out, host=_HOST, name=self.handle.name, nan_policy=self.nan_policy,
                                          fill_value=self.fill_value)
        return np.asarray(values, dtype=np.float32), report, out

    def __call__(self, images: Any, prompts: Any, metadata: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        return self.score(images, prompts, metadata)


def flow_grpo_scorer(reward: Any, device: Any = None, *, nan_policy: str = "raise", fill_value: float | None = None,
                     batch_size: int | None = None, allow_batch_relative: bool = False,
                     conventions: str = "flow_grpo",
                     **reward_kwargs: Any) -> Callable[..., tuple[np.ndarray, dict[str, Any]]]:
    """One rewardkit reward as a flow_grpo scorer: ``fn(images, prompts, metadata) -> (scores, info)``.

    Args:
        reward: a :class:`~rewardkit.Reward` instance (used as configured) or a registry name (built with
            ``reward_kwargs`` on the first call, once, behind a lock).
        device: int (CUDA ordinal), string or ``torch.device`` (flow_grpo passes ``accelerator.device``).
        nan_policy: ``"raise"`` (default): :class:`~rewardkit.integrations.NonFiniteRewardError` listing the
            invalid samples and reasons; ``"fill"``: ``fill_value`` for them, and ``info["valid_fraction"]``.
        batch_size: the reward's chunk size (default: the reward's own).
        allow_batch_relative: accept a batch-normalised composite (only correct when one call holds the
            whole normalisation batch on one process; see docs/integrations.md).
        conventions: ``"flow_grpo"`` (default): a name flow_grpo knows is built at flow_grpo's scale
            (:data:`FLOW_GRPO_CONVENTIONS`; ``reward_kwargs`` override it); ``"rewardkit"``: rewardkit's defaults.

    Returns:
        a callable returning ``(float32 numpy [B], {"valid_fraction", "n_invalid", "invalid"})``.
    """
    fill = _check_policy(nan_policy, fill_value, mask_ok=False, host=_HOST)
    factor = 1.0
    if isinstance(reward, str):
        reward_kwargs, factor = _named(reward, reward_kwargs, conventions)
    elif conventions not in CONVENTIONS:
        raise ValueError(f"conventions must be one of {CONVENTIONS}, got {conventions!r}")
    return _Scorer(LazyReward(reward, device, reward_kwargs), nan_policy, fill, batch_size, allow_batch_relative,
                   factor)


def flow_grpo_factory(reward: Any, **kwargs: Any) -> Callable[[Any], Callable]:
    """A factory for flow_grpo's ``score_functions`` table: ``score_functions["rk_pickscore"] =
    flow_grpo_factory("pickscore")``. flow_grpo passes ``device`` to a factory only when its code has a
    parameter of that name, which this one has."""

    def factory(device):
        return flow_grpo_scorer(reward, device, **kwargs)

    factory.__name__ = f"rewardkit_{reward if isinstance(reward, str) else getattr(reward, 'name', 'reward')}"
    return factory


def multi_score(device: Any, score_dict: Any, *, rewards: Mapping[str, Any] | None = None,
                reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None, nan_policy: str = "raise",
                fill_value: float | None = None, batch_size: int | None = None,
                allow_batch_relative: bool = False,
                conventions: str = "flow_grpo") -> Callable[..., tuple[dict[str, np.ndarray], dict[str, Any]]]:
    """A drop-in for flow_grpo's ``multi_score(device, score_dict)`` built from rewardkit rewards.

    ``fn(images, prompts, metadata, ref_images=None, only_strict=True)`` returns
    ``({name: scores, ..., "avg": sum_k w_k * scores_k}, info)``: ``"avg"`` is flow_grpo's weighted **sum**.
    ``ref_images`` (newer flow_grpo) become each editing reward's ``sources`` (one reference per sample);
    With ``geneval`` weighted, the result also holds flow_grpo's GenEval keys (``accuracy``, ``strict_accuracy``,
    ``<tag>_strict_accuracy``, ``<tag>_accuracy``; -10.0 on images of another tag), read from the reward's
    per-sample details with each image's ``metadata`` row; ``only_strict=True`` (the hosts' training default)
    gives ``accuracy`` 0.0 as the hosts' server does, which skips that verdict then.

    Args:
        device: as flow_grpo passes it (``accelerator.device``), or an int ordinal.
        score_dict: ``{name: weight}``: a dict, or anything with ``.items()`` such as the
            ``ml_collections.ConfigDict`` flow_grpo's scripts pass (``config.reward_fn``); a name is a registry
            name unless ``rewards`` maps it to an instance.
        rewards: optional ``{name: Reward instance}`` (used as configured: no convention is applied).
        reward_kwargs: optional ``{name: {option: value}}`` for rewards built by name (override the convention).
        nan_policy, fill_value: as in :func:`flow_grpo_scorer`; ``"fill"`` fills each reward's invalid
            samples before the sum, and ``info[name]["valid_fraction"]`` reports them.
        conventions: ``"flow_grpo"`` (default): each name flow_grpo knows is scored on flow_grpo's scale
            (:data:`FLOW_GRPO_CONVENTIONS`), so flow_grpo's weights keep their meaning; ``"rewardkit"``:
            rewardkit's own defaults (e.g. PickScore ~20, CLIPScore 2.5 * max(cos, 0)).

    Example::

        from rewardkit.integrations.flow_grpo import multi_score
        reward_fn = multi_score(accelerator.device, config.reward_fn)   # e.g. {"pickscore": 1.0, "clipscore": 0.5}
    """
    fill = _check_policy(nan_policy, fill_value, mask_ok=False, host=_HOST)
    if conventions not in CONVENTIONS:
        raise ValueError(f"conventions must be one of {CONVENTIONS}, got {conventions!r}")
    weights = _weights(score_dict)
    rewards = dict(rewards or {})
    reward_kwargs = dict(reward_kwargs or {})
    unknown = (set(rewards) | set(reward_kwargs)) - set(weights)
    if unknown:
        raise ValueError(f"rewards / reward_kwargs name {sorted(unknown)}, which score_dict does not weight")
    scorers = {}
    for name in weights:
        if name in rewards:
            kwargs, factor = reward_kwargs.get(name), 1.0
        else:
            kwargs, factor = _named(name, reward_kwargs.get(name), conventions)
        scorers[name] = _Scorer(LazyReward(rewards.get(name, name), device, kwargs), nan_policy,
                                fill, batch_size, allow_batch_relative, factor)

    def _fn(images, prompts, metadata, ref_images=None, only_strict=True):
        # the weights as score_dict holds them now: flow_grpo reads score_dict.items() at every call
        # (rewards.py:281), so a weight changed after multi_score was built applies from the next call
        now = _weights(score_dict)
        new = sorted(set(now) - set(scorers))
        if new:
            raise ValueError(f"score_dict now weights {new}, for which multi_score built no scorer (flow_grpo "
                             "builds them once too): build a new multi_score")
        details: dict[str, np.ndarray] = {}
        info: dict[str, Any] = {}
        total = None
        for name, w in now.items():
            rows = _geneval_rows(metadata, prompts) if name == _GENEVAL else None   # before the reward runs
            scores, report, out = scorers[name].score_output(images, prompts, metadata, ref_images)
            if rows is not None:  # flow_grpo's extra keys, before "geneval" as there (rewards.py:280-287)
                details.update(_geneval_keys(out, rows, only_strict))
            details[name] = scores
            info[name] = report
            total = w * scores.astype(np.float64) if total is None else total + w * scores.astype(np.float64)
        details["avg"] = total.astype(np.float32)
        return details, info

    _fn.__name__ = "rewardkit_multi_score"
    return _fn


def _geneval_rows(metadata: Any, prompts: Any) -> list[dict[str, Any]]:
    """Each image's GenEval metadata row (flow_grpo's ``prompt_metadata``), one per prompt."""
    n = 1 if isinstance(prompts, str) else len(prompts)
    metas = _metadata(metadata, n)
    if metas is None or len(metas) != n or not all(isinstance(m, Mapping) and "tag" in m for m in metas):
        raise ValueError(f"geneval needs each image's GenEval metadata row (tag, include, ...): got "
                         f"{0 if metas is None else len(metas)} rows for {n} prompts"
                         + ("" if metas is None else ", some without a 'tag'"))
    return metas


def _geneval_keys(out: Any, rows: list[dict[str, Any]], only_strict: bool) -> dict[str, np.ndarray]:
    """flow_grpo's ``accuracy``, ``strict_accuracy``, ``<tag>_strict_accuracy`` and ``<tag>_accuracy`` arrays
    (-10.0 on images of another tag; ``accuracy`` all 0.0 under ``only_strict``, as the host's server skips it)."""
    from ..rewards._geneval_records import flow_grpo_geneval

    return {k: np.asarray(v, dtype=np.float32) for k, v in flow_grpo_geneval(out, rows, bool(only_strict)).items()}
