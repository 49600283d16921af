"""verl-omni: a ``compute_score`` for the visual reward manager, with optional micro-batching.

verl-omni's visual reward manager calls ``compute_score(data_source=..., solution_image=..., ground_truth=...,
extra_info=..., **kwargs)`` by keyword, once per sample; synchronous scorers run through
``loop.run_in_executor(None, ...)``, so many threads call at once. ``solution_image`` is a uint8 CHW tensor
(or a 1xCxHxW batch, or an HxWxC array); the result is a float or ``{"score": float, ...}``, every sample with
the same keys (the manager collects the extra keys per sample).

Per-sample calls would run the reward model at batch size 1. With ``micro_batch=N`` concurrent calls are
collected (up to N, waiting at most ``max_wait_s`` for more) and scored in one reward call; each caller
gets its own sample's result. A sample's NaN policy is applied in its own call only.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Mapping

from ._common import LazyReward, NonFiniteRewardError, _check_policy, is_group_reward, refuse_batch_relative

__all__ = ["verl_compute_score", "VerlComputeScore"]

_HOST = "verl"


class _Slot:
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class VerlComputeScore:
    """``compute_score(data_source=None, solution_image=None, ground_truth=None, extra_info=None, **kwargs)``
    -> ``{"score": float, "valid": 1.0 | 0.0}``; ``VerlComputeScore(reward, ...)`` is :func:`verl_compute_score`
    (the arguments are documented there)."""

    def __init__(self, reward: Any, device: Any = None, *, prompt_key: str = "auto", source_key: str | None = None,
                 nan_policy: str = "raise", fill_value: float | None = None, micro_batch: int = 0,
                 max_wait_s: float = 0.02, batch_size: int | None = None, allow_batch_relative: bool = False,
                 group_size: int = 0, group_key: str = "uid", group_timeout_s: float = 600.0, **reward_kwargs: Any):
        if isinstance(group_size, bool) or int(group_size) < 0 or int(group_size) == 1:
            raise ValueError(f"group_size must be 0 (no groups) or >= 2 (verl's rollout.n), got {group_size!r}")
        if not (0 < float(group_timeout_s) < float("inf")):
            raise ValueError(f"group_timeout_s must be a finite number > 0, got {group_timeout_s!r}")
        self.group_size, self.group_key, self.group_timeout_s = int(group_size), str(group_key), float(group_timeout_s)
        self._groups: dict[Any, list[tuple[tuple, _Slot]]] = {}
        fill_value = _check_policy(nan_policy, fill_value, mask_ok=False, host=_HOST)
        handle = reward if isinstance(reward, LazyReward) else LazyReward(reward, device, reward_kwargs)
        micro_batch, max_wait_s = int(micro_batch), float(max_wait_s)
        if micro_batch < 0:
            raise ValueError(f"micro_batch must be >= 0, got {micro_batch}")
        if not (0 <= max_wait_s <= 10):
            raise ValueError(f"max_wait_s must lie in [0, 10] seconds, got {max_wait_s}")
        self.handle = handle
        self.prompt_key = prompt_key
        self.source_key = source_key
        self.nan_policy = nan_policy
        self.fill_value = fill_value
        self.micro_batch = micro_batch
        self.max_wait_s = max_wait_s
        self.batch_size = batch_size
        self.allow_batch_relative = allow_batch_relative
        self.__name__ = handle.name
        self._cv = threading.Condition()
        self._pending: list[tuple[tuple, _Slot]] = []
        self._collecting = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        for k in ("_cv", "_pending", "_collecting", "_groups"):
            state.pop(k)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cv, self._pending, self._collecting, self._groups = threading.Condition(), [], False, {}

    # ------------------------------------------------------------------ one sample's inputs
    def _prompt(self, ground_truth: Any, extra_info: Any) -> str:
        info = extra_info if isinstance(extra_info, Mapping) else {}
        if self.prompt_key == "auto":
            for key in ("prompt", "raw_prompt"):
                if isinstance(info.get(key), str):
                    return info[key]
            if isinstance(ground_truth, str):
                return ground_truth
            raise ValueError("no prompt for this sample: expected extra_info['prompt'] / ['raw_prompt'] or a string "
                             "ground_truth (set prompt_key= to name another extra_info key)")
        if self.prompt_key == "ground_truth":
            if not isinstance(ground_truth, str):
                raise ValueError(f"ground_truth must be the prompt string, got {type(ground_truth).__name__}")
            return ground_truth
        if not isinstance(info.get(self.prompt_key), str):
            raise ValueError(f"extra_info has no string {self.prompt_key!r} (the prompt); keys: {sorted(info)}")
        return info[self.prompt_key]

    def _sample(self, solution_image: Any, ground_truth: Any, extra_info: Any) -> tuple:
        from .. import media

        if solution_image is None:
            raise ValueError("compute_score got no solution_image")
        items = media.split_batch(solution_image)
        if len(items) != 1:
            raise ValueError(f"compute_score scores one sample per call; solution_image holds {len(items)} images")
        source = None
        if self.source_key is not None:
            info = extra_info if isinstance(extra_info, Mapping) else {}
            if info.get(self.source_key) is None:
                raise ValueError(f"extra_info has no {self.source_key!r} (the source image)")
            source = info[self.source_key]
        return items[0], self._prompt(ground_truth, extra_info), source

    # ------------------------------------------------------------------ scoring
    def _score_many(self, samples: list[tuple], groups: list | None = None) -> list[dict[str, float]]:
        reward = self.handle.get()
        refuse_batch_relative(reward, _HOST, self.allow_batch_relative)
        if is_group_reward(reward) and groups is None:
            raise ValueError(f"{self.handle.name} is a group reward: pass group_size= (verl's rollout.n) so that the "
                             f"samples of one {self.group_key!r} are scored together")
        sources = None
        if self.source_key is not None:
            sources = [s[2] if isinstance(s[2], (list, tuple)) else [s[2]] for s in samples]
        kw = {} if groups is None else {"groups": groups}
        out = reward([s[0] for s in samples], [s[1] for s in samples], sources=sources,
                     batch_size=self.batch_size, on_error="nan", **kw)
        # plain Python per sample: this path runs once per sample, so it avoids per-call tensor work
        return list(zip(out.scores.detach().float().cpu().tolist(), out.valid.tolist(), out.errors))

    def _finish(self, result: tuple[float, bool, str | None]) -> dict[str, float]:
        score, valid, error = result
        if valid and math.isfinite(score):
            return {"score": score, "valid": 1.0}
        if self.nan_policy == "raise":
            raise NonFiniteRewardError(_HOST, self.handle.name, [0], [error], 1)
        return {"score": self.fill_value, "valid": 0.0}

    def _batched(self, sample: tuple) -> Any:
        slot = _Slot()
        cv = self._cv
        with cv:
            self._pending.append((sample, slot))
            cv.notify_all()
            while not slot.done:
                if self._collecting or not self._pending:
                    cv.wait(0.05)
                    continue
                # become the collector: wait (bounded) for more callers, then score a batch
                self._collecting = True
                deadline = time.monotonic() + self.max_wait_s
                while len(self._pending) < self.micro_batch:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    cv.wait(left)
                batch = self._pending[:self.micro_batch]
                del self._pending[:self.micro_batch]
                self._collecting = False
                cv.notify_all()          # another waiting caller may collect the rest meanwhile
                cv.release()
                try:
                    results, error = self._score_many([s for s, _ in batch]), None
                except BaseException as exc:  # noqa: BLE001 - handed to every caller of the batch
                    results, error = None, exc
                finally:
                    cv.acquire()
                for j, (_, sl) in enumerate(batch):
                    sl.value, sl.error, sl.done = (None if results is None else results[j]), error, True
                cv.notify_all()
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _grouped(self, sample: tuple, uid: Any) -> Any:
        """Wait until the ``group_size`` samples of ``uid`` have arrived (verl calls once per sample, from many
        threads); the caller completing the group scores it in one call and hands every member its result."""
        slot = _Slot()
        cv = self._cv
        with cv:
            members = self._groups.setdefault(uid, [])
            members.append((sample, slot))
            if len(members) < self.group_size:
                deadline = time.monotonic() + self.group_timeout_s
                while not slot.done:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if self._groups.get(uid) is members:
                            del self._groups[uid]
                            err = TimeoutError(f"group {uid!r}: {len(members)} of {self.group_size} samples arrived "
                                               f"within {self.group_timeout_s:g} s (is group_size verl's rollout.n?)")
                            for _, sl in members:
                                sl.error, sl.done = err, True
                            cv.notify_all()
                        break
                    cv.wait(min(left, 0.5))
                if slot.error is not None:
                    raise slot.error
                return slot.value
            del self._groups[uid]
        try:
            results, error = self._score_many([s for s, _ in members], groups=[0] * len(members)), None
        except BaseException as exc:  # noqa: BLE001 - handed to every member of the group
            results, error = None, exc
        with cv:
            for j, (_, sl) in enumerate(members):
                sl.value, sl.error, sl.done = (None if results is None else results[j]), error, True
            cv.notify_all()
        if error is not None:
            raise error
        return slot.value

    def __call__(self, data_source: Any = None, solution_image: Any = None, ground_truth: Any = None,
                 extra_info: Any = None, **kwargs: Any) -> dict[str, float]:
        sample = self._sample(solution_image, ground_truth, extra_info)
        if self.group_size:
            info = extra_info if isinstance(extra_info, Mapping) else {}
            uid = info.get(self.group_key, kwargs.get(self.group_key))
            if uid is None:
                raise ValueError(f"group_size is set but this sample has no {self.group_key!r} (in extra_info or as "
                                 "a keyword): verl's GRPO group id")
            return self._finish(self._grouped(sample, uid))
        result = self._batched(sample) if self.micro_batch > 1 else self._score_many([sample])[0]
        return self._finish(result)


def verl_compute_score(reward: Any, device: Any = None, *, prompt_key: str = "auto", source_key: str | None = None,
                       nan_policy: str = "raise", fill_value: float | None = None, micro_batch: int = 0,
                       max_wait_s: float = 0.02, batch_size: int | None = None, allow_batch_relative: bool = False,
                       group_size: int = 0, group_key: str = "uid", group_timeout_s: float = 600.0,
                       **reward_kwargs: Any) -> VerlComputeScore:
    """A rewardkit reward as verl-omni's ``compute_score``.

    Args:
        reward: a :class:`~rewardkit.Reward` instance or a registry name (+ ``reward_kwargs``), loaded lazily.
        device: int (CUDA ordinal), string or ``torch.device``.
        prompt_key: where the prompt is: ``"auto"`` (``extra_info["prompt"]``, then ``extra_info["raw_prompt"]``,
            then ``ground_truth`` when it is a string), ``"ground_truth"``, or an ``extra_info`` key.
        source_key: ``extra_info`` key of the source image(s) for editing rewards.
        nan_policy: ``"raise"`` (default) or ``"fill"`` (``fill_value``; ``"valid"`` is 0.0 for that sample).
        micro_batch: N > 1 collects up to N concurrent calls into one reward call (waiting at most
            ``max_wait_s`` for more callers); 0 or 1 scores each call alone.
        group_size: for a :class:`~rewardkit.GroupReward`: verl's ``rollout.n``. Calls are held until the
            ``group_size`` samples of one ``group_key`` (verl's GRPO ``uid``, read from ``extra_info`` or a keyword)
            are in, then the group is scored in one call (at most ``group_timeout_s`` seconds of waiting; then
            every waiting member raises ``TimeoutError``). A group is never split or mixed with another.

    Returns:
        the callable; it returns ``{"score": float, "valid": 1.0 or 0.0}``.

    Example (a module named in verl's ``custom_reward_function.path`` / ``.name=compute_score``)::

        from rewardkit.integrations.verl import verl_compute_score
        compute_score = verl_compute_score("pickscore", device="cuda", micro_batch=32)
    """
    return VerlComputeScore(reward, device, prompt_key=prompt_key, source_key=source_key, nan_policy=nan_policy,
                            fill_value=fill_value, micro_batch=micro_batch, max_wait_s=max_wait_s,
                            batch_size=batch_size, allow_batch_relative=allow_batch_relative, group_size=group_size,
                            group_key=group_key, group_timeout_s=group_timeout_s, **reward_kwargs)
