"""The reward registry: one lazy ``name -> "module:Class"`` map, the single source of truth.

Third-party packages add rewards through the entry-point group ``rewardkit.rewards``::

    [project.entry-points."rewardkit.rewards"]
    my-reward = "my_pkg.rewards:MyReward"

Nothing is imported until a reward is loaded. ``rewardkit ls`` describes the built-ins from the generated
``rewardkit/_reward_meta.py`` (no reward module, no torch) and imports only plugins and run-time registrations.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from importlib import metadata as importlib_metadata
from typing import Any

from .errors import RegistryError

__all__ = ["load_reward", "list_rewards", "register_reward", "get_reward_class", "resolve_name", "refusal_reason",
           "ENTRY_POINT_GROUP", "REFUSED"]

ENTRY_POINT_GROUP = "rewardkit.rewards"

# Built-in rewards. Keep sorted by family; one file per family under rewardkit/rewards/.
BUILTIN: dict[str, str] = {
    "clipscore": "rewardkit.rewards.clipscore:CLIPScore",
    "ocr": "rewardkit.rewards.ocr:OCRReward",
    "faithfulness": "rewardkit.rewards.faithfulness:Faithfulness",
    "constraints": "rewardkit.rewards.constraints:Constraints",
    "detectors": "rewardkit.rewards.detectors:Detectors",
    "composite": "rewardkit.compose.composite:Composite",
    "weighted-sum": "rewardkit.compose.composite:WeightedSum",
    "pickscore": "rewardkit.rewards.pickscore:PickScore",
    "preference": "rewardkit.rewards.preference:PreferenceReward",
    "evr": "rewardkit.rewards.evr:EVR",
    "hpsv2": "rewardkit.rewards.hpsv2:HPSv2",
    "aesthetic": "rewardkit.rewards.aesthetic:Aesthetic",
    "imagereward": "rewardkit.rewards.imagereward:ImageReward",
    "hpsv3": "rewardkit.rewards.hpsv3:HPSv3",
    "editreward": "rewardkit.rewards.editreward:EditReward",
    "vqascore": "rewardkit.rewards.vqascore:VQAScore",
    "unifiedreward": "rewardkit.rewards.unifiedreward:UnifiedReward",
    "remote": "rewardkit.serve.client:RemoteReward",
    "rational": "rewardkit.rewards.rational:RationalReward",
    "geneval": "rewardkit.rewards.geneval:GenEval",
    "jpeg-compressibility": "rewardkit.rewards.jpeg_compressibility:JpegCompressibility",
    "jpeg-incompressibility": "rewardkit.rewards.jpeg_incompressibility:JpegIncompressibility",
    "qwenvl": "rewardkit.rewards.qwenvl:QwenVLAesthetic",
}

# Alternative names -> canonical name.
ALIASES: dict[str, str] = {
    "clip": "clipscore",
    "clip-score": "clipscore",
    "pick-score": "pickscore",
    "constraint": "constraints",
    "anti-hacking": "detectors",
    "dsg": "faithfulness",
    "arena-rm": "preference",
    "hps": "hpsv2",
    "hpsv2.1": "hpsv2",
    "hpsv2-score": "hpsv2",  # flow_grpo @ 94e23ee's multi_score name (hpsv2_score)
    "laion-aesthetic": "aesthetic",
    "image-reward": "imagereward",
    "edit-reward": "editreward",
    "vqa-score": "vqascore",
    "unified-reward": "unifiedreward",
    "rationalrewards": "rational",
}

# Reward names of the RL hosts (flow_grpo's / DiffusionNFT's multi_score) that rewardkit cannot score, with the
# reason; resolving one raises it (rewardkit.integrations.flow_grpo refuses them with it too). Keys as the hosts
# spell them; looked up with case and '-' vs '_' forgiven (refusal_reason).
REFUSED: dict[str, str] = {
    "deqa": "DeQA-Score (zhiyuanyou/DeQA-Score-Mix3, reward-server's deqa.py:5-11) is an mPLUG-Owl2 model whose "
            "modelling code ships inside the checkpoint (trust_remote_code=True); transformers has no class for it "
            "and rewardkit never runs a checkpoint's code, so its level-token scoring cannot run on the judge engine",
    "video_ocr": "flow_grpo's video_ocr scores videos (5-D frame tensors); rewardkit scores images: use 'ocr' for "
                 "images",
    "image_similarity": "flow_grpo's image_similarity (CLIP image-to-reference cosine, called with ref_images) has "
                        "no rewardkit counterpart yet",
    "seedscore": "flow_grpo's seedscore calls ByteDance's Seed-VL service (seedvl.py), which rewardkit does not "
                 "wrap",
}

_lock = threading.Lock()
_registry: dict[str, str] | None = None
_conflicts: dict[str, list[str]] = {}
_programmatic: dict[str, str] = {}


def _build() -> dict[str, str]:
    global _registry
    with _lock:
        if _registry is not None:
            return _registry
        reg = dict(BUILTIN)
        claims: dict[str, list[str]] = {k: [f"rewardkit (builtin {v})"] for k, v in BUILTIN.items()}
        for name, target in _programmatic.items():
            reg[name] = target
        try:
            eps = importlib_metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception:  # a broken distribution's metadata must not break rewardkit
            eps = []
        for ep in eps:
            dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
            claims.setdefault(ep.name, []).append(f"{dist} ({ep.value})")
            if ep.name in reg or ep.name in ALIASES:
                continue
            reg[ep.name] = ep.value
        for name, who in claims.items():
            if len(who) > 1:
                _conflicts[name] = who
        _registry = reg
        return reg


def _reset() -> None:
    """Forget the cached registry (tests; after installing a plugin in a running process)."""
    global _registry
    with _lock:
        _registry = None
        _conflicts.clear()


def register_reward(name: str, target: str | type, *, overwrite: bool = False) -> None:
    """Register a reward at run time: ``target`` is ``"module:Class"`` or a Reward subclass."""
    if not isinstance(target, str):
        target = f"{target.__module__}:{target.__qualname__}"
    reg = _build()
    if not overwrite and (name in reg or name in ALIASES) and reg.get(name) != target:
        raise RegistryError(f"reward name {name!r} is already registered to {reg.get(name) or ALIASES[name]!r}; "
                            "pass overwrite=True to replace it")
    with _lock:
        _programmatic[name] = target
        reg[name] = target


def resolve_name(name: str) -> str:
    """Canonical registry name for ``name`` (aliases, case and '_' vs '-' forgiven)."""
    reg = _build()
    if not isinstance(name, str) or not name:
        raise RegistryError(f"reward name must be a non-empty string, got {name!r}")
    for cand in (name, name.lower(), name.lower().replace("_", "-")):
        if cand in reg:
            return cand
        if cand in ALIASES:
            return ALIASES[cand]
    reason = refusal_reason(name)
    if reason is not None:
        raise RegistryError(f"reward {name!r} is refused: {reason}")
    known = sorted(set(reg) | set(ALIASES))
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise RegistryError(f"unknown reward {name!r}.{hint} Known rewards: {', '.join(sorted(reg))}")


def refusal_reason(name: str) -> str | None:
    """Why rewardkit refuses the host reward name ``name`` (:data:`REFUSED`; case and '-' vs '_' forgiven), or
    None when it does not. A reward registered under that name (a plugin) is not refused: it resolves first."""
    if not isinstance(name, str):
        return None
    return REFUSED.get(name.lower().replace("-", "_"))


def get_reward_class(name: str) -> type:
    canonical = resolve_name(name)
    if canonical in _conflicts:
        raise RegistryError(f"reward name {canonical!r} is claimed by several entries: "
                            + "; ".join(_conflicts[canonical]) + ". Uninstall one of them.")
    target = _build()[canonical]
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_reward(name: str, config: Any = None, /, **kwargs: Any):
    """Build a reward by registry name: ``load_reward("pickscore", device="cuda", dtype="bfloat16")``.

    ``config`` may be the reward's config dataclass, a mapping or a YAML path; ``kwargs`` override it.
    """
    cls = get_reward_class(name)
    try:
        return cls(config, **kwargs)
    except OSError as exc:  # a hub id that cannot be fetched: say which, and how to pass a local copy
        from .models.zoo import hub_unavailable

        err = hub_unavailable(exc, _model_of(cls, config, kwargs))
        if err is None:
            raise
        raise err from exc


def _model_of(cls: Any, config: Any, kwargs: dict[str, Any]) -> str | None:
    """The ``model`` a reward is being built with: the keyword, the config's, or the config class default."""
    for src in (kwargs, config if isinstance(config, dict) else None):
        if src and isinstance(src.get("model"), str):
            return src["model"]
    if config is not None and isinstance(getattr(config, "model", None), str):
        return config.model
    try:
        default = getattr(cls.Config(), "model", None)
    except Exception:  # noqa: BLE001  a config without defaults: no id to name
        return None
    return default if isinstance(default, str) and default else None


def list_rewards(*, include_aliases: bool = False) -> list[str]:
    """Names of every registered reward (builtin and plugins), sorted."""
    names = sorted(_build())
    if include_aliases:
        names = sorted(set(names) | set(ALIASES))
    return names


def conflicts() -> dict[str, list[str]]:
    _build()
    return dict(_conflicts)
