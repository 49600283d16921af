"""What every trainer adapter shares: lazy loading behind a lock, devices, the NaN policy.

Adapters talk to a reward only through the public :class:`~rewardkit.Reward` call
(``reward(images, prompt, sources=..., metadata=..., batch_size=..., on_error="nan")`` -> ``RewardOutput``),
so any ``Reward`` subclass works unchanged, local or remote.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Mapping, Sequence

import torch

from ..errors import ConfigError

__all__ = ["LazyReward", "NonFiniteRewardError", "NAN_POLICIES", "apply_nan_policy", "as_device",
           "refuse_batch_relative", "is_group_reward"]

#: ``raise``: a clear error before the host sees anything (default); ``fill``: ``fill_value`` in place of
#: every invalid sample, the valid fraction reported; ``mask``: ``None`` (only TRL understands it).
NAN_POLICIES = ("raise", "fill", "mask")
_MAX_LISTED = 10


class NonFiniteRewardError(ValueError):
    """Some samples have no score (NaN) and the adapter's ``nan_policy`` is ``"raise"``.

    Attributes:
        indices: positions of the invalid samples in the host's batch.
        reasons: the reward's reason for each of them.
    """

    def __init__(self, host: str, name: str, indices: Sequence[int], reasons: Sequence[str | None], n: int):
        self.indices = list(indices)
        self.reasons = [r or "non-finite score" for r in reasons]
        lines = [f"  sample {i}: {r}" for i, r in zip(self.indices[:_MAX_LISTED], self.reasons)]
        more = len(self.indices) - _MAX_LISTED
        if more > 0:
            lines.append(f"  ... and {more} more")
        super().__init__(
            f"reward {name!r} could not score {len(self.indices)} of {n} samples, so the {host} adapter refuses to "
            f"hand NaN rewards to the trainer (they would make every advantage of the step non-finite):\n"
            + "\n".join(lines)
            + "\nFix the inputs, or choose nan_policy='fill' (a fixed value, the valid fraction is reported)"
            + (" or nan_policy='mask' (None: TRL leaves the sample out of its NaN-aware sums)." if host == "TRL"
               else "."))


def as_device(device: Any) -> torch.device | None:
    """``None``, an int (a CUDA ordinal, as ``accelerator.device.index`` or a local rank), a string or a
    ``torch.device`` -> ``torch.device`` (or None: leave the reward where it is)."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"device must be an int, a string or a torch.device, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device ordinal must be >= 0, got {device}")
        return torch.device("cuda", device)
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    raise TypeError(f"device must be an int, a string or a torch.device, got {type(device).__name__}")


def _check_policy(nan_policy: str, fill_value: Any, *, mask_ok: bool, host: str) -> float | None:
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
    if nan_policy == "mask" and not mask_ok:
        raise ValueError(f"{host} cannot mask a sample (it has no 'missing reward' value): use nan_policy='raise' "
                         "or 'fill'")
    if nan_policy == "fill":
        if fill_value is None or isinstance(fill_value, bool) or not isinstance(fill_value, (int, float)) \
                or not math.isfinite(float(fill_value)):
            raise ValueError(f"nan_policy='fill' needs a finite fill_value (e.g. the reward's lowest score), "
                             f"got {fill_value!r}")
        return float(fill_value)
    return None


def is_group_reward(reward: Any) -> bool:
    """A :class:`~rewardkit.GroupReward`: the adapters hand it the host's groups (and gather them across ranks)."""
    from ..compose.group import GroupReward

    return isinstance(reward, GroupReward)


def refuse_batch_relative(reward: Any, host: str, allow: bool) -> None:
    """A batch- or group-normalised composite scored on one rank's slice gives other z-scores than over the
    whole batch: refuse it unless the caller says each call holds the whole normalisation batch. (A
    ``GroupReward`` is not refused: the adapters give it the host's groups.)"""
    if allow or not getattr(reward, "batch_relative", False) or is_group_reward(reward):
        return
    name = getattr(reward, "name", type(reward).__name__)
    raise ConfigError(
        f"reward {name!r} normalises over the call (normalize={getattr(reward.config, 'normalize', '?')!r}), but "
        f"{host} calls its reward on one process's slice of the batch (and partial prompt groups), so the "
        "z-scores would differ from those over the whole batch. Either\n"
        "  - score per rank with comp.axis_scores(images, prompts, metadata=...) and combine after gathering "
        "every rank: rewardkit.distributed.gather_combine(comp, axes) (see docs/integrations.md, "
        "'Composites across ranks'), or\n"
        "  - use a per-sample normalisation (normalize='fixed' with calibrated mean/std, or 'none'), or\n"
        "  - pass allow_batch_relative=True if every call really holds whole groups on a single process.")


class LazyReward:
    """A reward instance, or a registry name + kwargs loaded on first use (once, behind a lock).

    ``device`` (int, string or ``torch.device``) is applied with ``reward.to(device)`` after loading.
    """

    def __init__(self, reward: Any, device: Any = None, kwargs: Mapping[str, Any] | None = None):
        from ..reward import Reward

        self._device = as_device(device)
        self._lock = threading.Lock()
        self._kwargs = dict(kwargs or {})
        if isinstance(reward, Reward):
            if self._kwargs:
                raise TypeError(f"reward options {sorted(self._kwargs)} were given with a reward instance; pass a "
                                "registry name to have the adapter build it, or configure the instance yourself")
            self._reward: Any = reward
            self._name = reward.name or type(reward).__name__
            if self._device is not None:
                reward.to(self._device)
        elif isinstance(reward, str):
            from ..registry import resolve_name

            self._name = resolve_name(reward)   # an unknown name fails here, not at the first training step
            self._reward = None
        else:
            raise TypeError(f"reward must be a rewardkit Reward or a registry name, got {type(reward).__name__}")

    def __getstate__(self) -> dict[str, Any]:   # TRL / multiprocessing may pickle reward functions
        state = dict(vars(self))
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def loaded(self) -> bool:
        return self._reward is not None

    def get(self):
        r = self._reward
        if r is not None:
            return r
        with self._lock:
            if self._reward is None:
                import dataclasses

                from ..registry import get_reward_class

                cls = get_reward_class(self._name)
                kwargs = dict(self._kwargs)
                cfg_cls = cls.Config
                fields = {f.name for f in dataclasses.fields(cfg_cls)} if dataclasses.is_dataclass(cfg_cls) else set()
                if self._device is not None and "device" in fields and "device" not in kwargs:
                    kwargs["device"] = str(self._device)   # load straight onto this rank's device
                try:
                    r = cls(None, **kwargs)
                except OSError as exc:  # a hub id that cannot be fetched: the same message as load_reward
                    from ..models.zoo import hub_unavailable
                    from ..registry import _model_of

                    err = hub_unavailable(exc, _model_of(cls, None, kwargs))
                    if err is None:
                        raise
                    raise err from exc
                if self._device is not None:
                    r.to(self._device)
                self._reward = r
            return self._reward


def apply_nan_policy(out: Any, *, host: str, name: str, nan_policy: str, fill_value: float | None,
                     ) -> tuple[list[float | None], dict[str, Any]]:
    """Host-ready per-sample values from a ``RewardOutput`` and the policy's report.

    Returns ``(values, report)``: floats (``None`` for masked samples under ``mask``) and
    ``{"valid_fraction", "n_invalid", "invalid": {index: reason}}``.
    Raises :class:`NonFiniteRewardError` under ``raise`` when any sample is invalid.
    """
    scores = out.scores.detach().float().cpu()
    valid = out.valid.cpu() & torch.isfinite(scores)
    n = int(scores.shape[0])
    bad = (~valid).nonzero().flatten().tolist()
    report = {"valid_fraction": (n - len(bad)) / n if n else 1.0, "n_invalid": len(bad),
              "invalid": {int(i): (out.errors[i] or "non-finite score") for i in bad[:_MAX_LISTED * 10]}}
    if bad and nan_policy == "raise":
        raise NonFiniteRewardError(host, name, bad, [out.errors[i] for i in bad], n)
    values: list[float | None] = scores.tolist()
    for i in bad:
        values[i] = None if nan_policy == "mask" else fill_value
    return values, report
