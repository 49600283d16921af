"""TRL ``GRPOTrainer`` reward functions for vision-language policies.

TRL (1.16, ``GRPOTrainer._calculate_rewards``) calls every custom reward function by keyword::

    reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                trainer_state=state, log_extra=..., log_metric=..., **dataset_columns)

``completions`` are strings, or for conversational data lists of messages
(``[{"role": "assistant", "content": "..."}]``); the dataset's ``image`` / ``images`` column arrives as a
keyword of the same name (one PIL image, or a list of them, per completion). The function returns one
``float | None`` per completion; ``None`` means "no reward" and TRL leaves it out of its NaN-aware sums.
The function's ``__name__`` labels TRL's ``rewards/<name>/mean`` logs. Async reward functions run on TRL's
event loop, concurrently with the others.

A visual reward scores an image against a text: for a VLM policy that is the dataset image against the
policy's completion (a caption, an answer) by default (``text="completion"``).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable, Sequence

from ._common import LazyReward, _check_policy, apply_nan_policy, is_group_reward, refuse_batch_relative

__all__ = ["trl_reward_func", "TRLRewardFunction", "AsyncTRLRewardFunction", "message_text", "EMPTY_COMPLETION"]

_HOST = "TRL"


def message_text(x: Any, role: str | None = None) -> str:
    """The text of a string, a message, or the last message (of ``role``, when given) of a conversation.

    A message's ``content`` may be a string or a list of parts (``{"type": "text", "text": ...}``; image
    parts are skipped); text parts are joined with a space.
    """
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        content = x.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, (list, tuple)):
            return " ".join(p.get("text", "") for p in content
                            if isinstance(p, dict) and p.get("type") == "text" and p.get("text")).strip()
        raise TypeError(f"message content must be a string or a list of parts, got {type(content).__name__}")
    if isinstance(x, (list, tuple)):
        msgs = [m for m in x if isinstance(m, dict) and (role is None or m.get("role") == role)]
        if not msgs:
            raise ValueError(f"conversation has no {role or ''} message".replace("  ", " "))
        return message_text(msgs[-1])
    raise TypeError(f"expected a string or a list of messages, got {type(x).__name__}")


EMPTY_COMPLETION = ("nan", "fill", "reward")


def _with_empty_as_invalid(out: Any, keep: list[int], n: int) -> Any:
    """``out`` (the scored samples ``keep``) spread over ``n`` samples; the others NaN + "completion is empty"."""
    import torch

    from ..reward import RewardOutput

    scores = torch.full((n,), float("nan"))
    valid = torch.zeros(n, dtype=torch.bool)
    errors: list[str | None] = ["completion is empty"] * n
    if out is not None:
        idx = torch.tensor(keep, dtype=torch.long)
        scores[idx] = out.scores.detach().float().cpu()
        valid[idx] = out.valid.cpu()
        for j, i in enumerate(keep):
            errors[i] = out.errors[j]
    return RewardOutput(scores=scores, valid=valid, errors=errors)


class TRLRewardFunction:
    """A synchronous TRL reward function; ``TRLRewardFunction(reward, ...)`` is :func:`trl_reward_func` with
    ``is_async=False`` (the arguments are documented there)."""

    def __init__(self, reward: Any, device: Any = None, *, text: str | Callable = "completion",
                 image_column: str = "auto", image_index: int = 0, metadata_columns: Sequence[str] = (),
                 nan_policy: str = "raise", fill_value: float | None = None, batch_size: int | None = None,
                 allow_batch_relative: bool = False, name: str | None = None, empty_completion: str = "nan",
                 empty_value: float | None = None, num_generations: int | None = None, **reward_kwargs: Any):
        if num_generations is not None and (isinstance(num_generations, bool) or int(num_generations) < 1):
            raise ValueError(f"num_generations must be None or >= 1, got {num_generations!r}")
        self.num_generations = None if num_generations is None else int(num_generations)
        if not (callable(text) or text in ("completion", "prompt")):
            raise ValueError("text must be 'completion', 'prompt' or a callable(prompt, completion) -> str, "
                             f"got {text!r}")
        if image_column not in ("auto", "image", "images"):
            raise ValueError(f"image_column must be 'auto', 'image' or 'images', got {image_column!r}")
        if empty_completion not in EMPTY_COMPLETION:
            raise ValueError(f"empty_completion must be one of {EMPTY_COMPLETION}, got {empty_completion!r}")
        if empty_completion == "fill":
            if isinstance(empty_value, bool) or not isinstance(empty_value, (int, float)) \
                    or not math.isfinite(float(empty_value)):
                raise ValueError("empty_completion='fill' needs a finite empty_value (e.g. the reward's lowest "
                                 f"score), got {empty_value!r}")
            empty_value = float(empty_value)
        elif empty_value is not None:
            raise ValueError("empty_value is only used with empty_completion='fill'")
        handle = reward if isinstance(reward, LazyReward) else LazyReward(reward, device, reward_kwargs)
        self.handle = handle
        self.text = text
        self.image_column = image_column
        self.image_index = int(image_index)
        self.metadata_columns = tuple(metadata_columns)
        self.nan_policy = nan_policy
        self.fill_value = _check_policy(nan_policy, fill_value, mask_ok=True, host=_HOST)
        self.batch_size = batch_size
        self.allow_batch_relative = allow_batch_relative
        self.empty_completion = empty_completion
        self.empty_value = empty_value
        self.__name__ = name or handle.name.replace("-", "_")

    def _images(self, kwargs: dict[str, Any], n: int) -> list[Any]:
        col = self.image_column
        if col == "auto":
            col = "images" if "images" in kwargs else "image" if "image" in kwargs else None
        if col is None or col not in kwargs:
            raise ValueError(f"reward function {self.__name__!r} needs the dataset's image column, but TRL passed "
                             f"no {'image / images' if col is None else repr(col)} keyword (got: "
                             f"{sorted(k for k in kwargs if k not in ('trainer_state', 'log_extra', 'log_metric'))}). "
                             "Keep an 'image' or 'images' column in the dataset")
        column = list(kwargs[col])
        if len(column) != n:
            raise ValueError(f"column {col!r} has {len(column)} entries for {n} completions")
        if col == "image":
            return column
        out = []
        for i, entry in enumerate(column):
            imgs = list(entry) if isinstance(entry, (list, tuple)) else [entry]
            out.append(imgs[self.image_index] if -len(imgs) <= self.image_index < len(imgs) else None)
        return out

    def _texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        if callable(self.text):
            return [self.text(p, c) for p, c in zip(prompts, completions)]
        if self.text == "prompt":
            return [message_text(p, "user") for p in prompts]
        return [message_text(c, "assistant") if not isinstance(c, str) else c for c in completions]

    def _score(self, prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict[str, Any]) -> list[float | None]:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"TRL passed {len(prompts)} prompts for {n} completions")
        reward = self.handle.get()
        refuse_batch_relative(reward, _HOST, self.allow_batch_relative)
        metadata = None
        if self.metadata_columns:
            missing = [c for c in self.metadata_columns if c not in kwargs]
            if missing:
                raise ValueError(f"metadata columns {missing} are not in the batch TRL passed")
            metadata = [{c: kwargs[c][i] for c in self.metadata_columns} for i in range(n)]
        images, texts = self._images(kwargs, n), self._texts(prompts, completions)
        # An empty text is a policy that wrote nothing. "fill": a valid, bad sample that gets empty_value; "nan":
        # NaN + "completion is empty" (whatever the reward would say of an empty text: several published rewards
        # score one, which a policy could exploit), then the NaN policy; "reward": the reward's own rule.
        keep = list(range(n))
        if self.empty_completion != "reward":
            keep = [i for i, t in enumerate(texts) if not (isinstance(t, str) and not t.strip())]
        values: list[float | None] = [self.empty_value] * n
        report = {"valid_fraction": 1.0}
        if n and (keep or self.empty_completion == "nan"):
            pick = (lambda xs: [xs[i] for i in keep]) if len(keep) < n else (lambda xs: xs)
            if is_group_reward(reward):
                out = self._group_call(reward, images, texts, metadata, keep, n)
            elif keep:
                out = reward(pick(images), pick(texts), metadata=pick(metadata) if metadata is not None else None,
                             batch_size=self.batch_size, on_error="nan")
            if self.empty_completion == "nan" and len(keep) < n:
                out = _with_empty_as_invalid(out if keep else None, keep, n)
                keep = list(range(n))
            sub, report = apply_nan_policy(out, host=_HOST, name=self.handle.name, nan_policy=self.nan_policy,
                                           fill_value=self.fill_value)
            for i, v in zip(keep, sub):
                values[i] = v
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(f"rewardkit/{self.__name__}/valid_fraction", report["valid_fraction"])
            if self.empty_completion == "fill":
                log_metric(f"rewardkit/{self.__name__}/empty_fraction", (n - len(keep)) / n if n else 0.0)
        return values

    def _group_call(self, reward: Any, images: list, texts: list, metadata: list | None, keep: list[int], n: int):
        """A :class:`~rewardkit.GroupReward` on TRL's batch: TRL's sampler repeats each prompt ``num_generations``
        times in a row and splits the batch over processes in rank order, so completion ``i`` of process ``r``
        (``n`` per process) is in group ``(r * n + i) // num_generations``; groups spread over processes are
        completed with one all-gather. An empty completion (left out by ``keep``) is a missing member."""
        from .. import distributed

        if self.num_generations is None:
            raise ValueError(f"reward function {self.__name__!r} is a group reward: pass num_generations= (GRPOConfig's "
                             "num_generations) so it knows TRL's groups")
        offset = distributed.rank() * n
        groups = [(offset + i) // self.num_generations for i in keep]
        return reward.score_gathered([images[i] for i in keep], [texts[i] for i in keep], groups=groups,
                                     metadata=None if metadata is None else [metadata[i] for i in keep],
                                     batch_size=self.batch_size)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return self._score(prompts, completions, kwargs)


class AsyncTRLRewardFunction(TRLRewardFunction):
    """The same reward as a coroutine function: TRL awaits it on its event loop while other async rewards
    run; the model call runs in a worker thread (``asyncio.to_thread``)."""

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return await asyncio.to_thread(self._score, prompts, completions, kwargs)


def trl_reward_func(reward: Any, device: Any = None, *, text: str | Callable = "completion",
                    image_column: str = "auto", image_index: int = 0, metadata_columns: Sequence[str] = (),
                    nan_policy: str = "raise", fill_value: float | None = None, batch_size: int | None = None,
                    name: str | None = None, is_async: bool = False, allow_batch_relative: bool = False,
                    empty_completion: str = "nan", empty_value: float | None = None,
                    num_generations: int | None = None, **reward_kwargs: Any) -> TRLRewardFunction:
    """A rewardkit reward as a TRL ``GRPOTrainer`` reward function.

    Args:
        reward: a :class:`~rewardkit.Reward` instance or a registry name (built with ``reward_kwargs`` on the
            first call, once, behind a lock).
        device: int (CUDA ordinal), string or ``torch.device`` for the reward model.
        text: what the image is scored against: ``"completion"`` (default; the text of the last assistant
            message for conversational data), ``"prompt"`` (the last user message) or a callable
            ``(prompt, completion) -> str``.
        image_column: ``"auto"`` (``images`` if present, else ``image``), ``"image"`` or ``"images"``.
        image_index: which image of an ``images`` list is scored.
        metadata_columns: dataset columns passed to the reward as per-sample ``metadata``.
        nan_policy: ``"raise"`` (default), ``"fill"`` (``fill_value``) or ``"mask"`` (``None``: TRL skips the
            sample in its NaN-aware reward sum; a completion that no reward function scores gets a warning
            from TRL). The valid fraction is logged as ``rewardkit/<name>/valid_fraction``.
        empty_completion: what an empty (or whitespace-only) text gets. ``"nan"`` (default): NaN + "completion
            is empty" without calling the reward, then ``nan_policy`` (so by default an empty caption stops
            training with the reason). ``"fill"``: ``empty_value`` (required, finite), without calling the
            reward, counted as a valid sample; the fraction is logged as ``rewardkit/<name>/empty_fraction``.
            ``"reward"``: the reward's own rule (PickScore, CLIPScore, HPS score an empty prompt as their
            packages do; judge rewards give NaN). Captioning wants ``"fill"`` with the reward's lowest score:
            writing nothing is a bad caption the policy must learn to avoid, not a sample to skip.
        name: ``__name__`` for TRL's logs (default: the reward's registry name).
        is_async: return a coroutine function (TRL runs async rewards concurrently).
        num_generations: GRPOConfig's ``num_generations``, needed when ``reward`` is a
            :class:`~rewardkit.GroupReward`: completions ``k * num_generations ..`` of the global batch (TRL's
            consecutive repeats) form one group, completed across processes with one all-gather.

    The classes :class:`TRLRewardFunction` / :class:`AsyncTRLRewardFunction` take the same arguments.

    Example::

        from trl import GRPOConfig, GRPOTrainer
        from rewardkit.integrations.trl import trl_reward_func
        trainer = GRPOTrainer(model=..., reward_funcs=[trl_reward_func("clipscore")], args=GRPOConfig(...),
                              train_dataset=dataset)          # dataset columns: prompt (messages), image
    """
    cls = AsyncTRLRewardFunction if is_async else TRLRewardFunction
    return cls(reward, device, text=text, image_column=image_column, image_index=image_index,
               metadata_columns=metadata_columns, nan_policy=nan_policy, fill_value=fill_value,
               batch_size=batch_size, allow_batch_relative=allow_batch_relative, name=name,
               empty_completion=empty_completion, empty_value=empty_value, num_generations=num_generations,
               **reward_kwargs)
