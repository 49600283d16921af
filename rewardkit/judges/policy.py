"""What a judge-backed reward does when its judge fails, and what counts as a usable answer.

One option, ``on_judge_error``, with one meaning for every judge-backed reward (``evr``, ``faithfulness``,
``constraints``, ``detectors``, ``vqascore``, ``unifiedreward``, ``rational``, ``composite`` and any later one:
the fault-matrix test finds them by this option in their configuration):

- ``"auto"`` (default): follow the ``on_error`` of the call. ``reward(..., on_error="nan")`` never raises for a
  judge failure: the samples whose judge call failed (after the backend's bounded retries) are NaN with the
  error as reason, the rest of the call is kept; ``on_error="raise"`` raises it. When rewards are
  nested (a composite calling its axes) the outermost call's ``on_error`` decides.
- ``"nan"``: always NaN + reason, whatever the call's ``on_error``.
- ``"raise"``: always raise.

A judge failure is an exception from a judge call: :class:`JudgeError` (the OpenAI backend's
``JudgeServerError``), any ``RuntimeError`` (e.g. out of memory in a local judge) or ``OSError``. A
:class:`~rewardkit.judges.ChoiceError` (a label that is not one token) is a configuration error and always
raises. With a backend that sends one request per row (``isolates_rows``: the OpenAI backend) a failing
request fails only its sample (:func:`call_rows`); when every request fails, or with a batched local backend,
the scoring chunk (``batch_size``) fails together. Every such reason starts with ``JUDGE_FAILURE_PREFIX``.

A judge *answer* that carries no usable probability (a NaN row from the backend, a row outside [0, 1] or not
summing to 1) is not a failure but an unanswered question: the reward reports NaN + a reason naming it.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

# shared with the contract (rewardkit.reward's compare), so they live at its level; importable from here as before
from ..reasons import JUDGE_FAILURE_PREFIX, join_reasons

__all__ = ["JudgeError", "JUDGE_ERROR_POLICIES", "JUDGE_FAILURES", "JudgePolicyMixin", "judge_policy",
           "check_policy", "call_on_error", "usable_rows", "call_rows", "describe_failure", "is_judge_failure",
           "JUDGE_FAILURE_PREFIX", "join_reasons"]

JUDGE_ERROR_POLICIES = ("auto", "nan", "raise")


class JudgeError(RuntimeError):
    """A judge call failed (server down after retries, unreadable response, wrong output shape...)."""


#: exceptions from a judge call that the policy turns into NaN + reason
JUDGE_FAILURES: tuple[type[BaseException], ...] = (JudgeError, RuntimeError, OSError)

# on_error of the outermost reward call in this thread / context (None outside any call)
_CALL_ON_ERROR: ContextVar[str | None] = ContextVar("rewardkit_call_on_error", default=None)


def check_policy(value: Any, owner: str) -> str:
    if value not in JUDGE_ERROR_POLICIES:
        raise ValueError(f"{owner} on_judge_error must be one of {JUDGE_ERROR_POLICIES}, got {value!r}")
    return value


def judge_policy(setting: str) -> str:
    """The effective policy, ``"nan"`` or ``"raise"``, for a reward configured with ``setting``."""
    if setting == "auto":
        return "nan" if _CALL_ON_ERROR.get() == "nan" else "raise"
    return setting


def is_judge_failure(exc: BaseException) -> bool:
    """True for an exception the policy may turn into NaN (not a ``NotImplementedError`` / ``RecursionError``:
    those are bugs or unsupported setups and always raise)."""
    return isinstance(exc, JUDGE_FAILURES) and not isinstance(exc, (NotImplementedError, RecursionError))


def describe_failure(exc: BaseException) -> str:
    return f"{JUDGE_FAILURE_PREFIX}: {type(exc).__name__}: {exc}"


class JudgePolicyMixin:
    """Records the call's ``on_error`` (outermost call wins) so ``on_judge_error="auto"`` can follow it.

    Put it before :class:`~rewardkit.reward.Reward` in the bases."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # show the wrapped Reward.__call__'s signature and docs in help() / inspect.signature
        import inspect

        for base in cls.__mro__:
            fn = base.__dict__.get("__call__")
            if fn is not None and not issubclass(base, JudgePolicyMixin):
                JudgePolicyMixin.__call__.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
                JudgePolicyMixin.__call__.__doc__ = fn.__doc__
                break

    def __call__(self, *args: Any, on_error: str = "raise", **kwargs: Any):
        with call_on_error(on_error):
            return super().__call__(*args, on_error=on_error, **kwargs)  # type: ignore[misc]


@contextmanager
def call_on_error(on_error: str) -> Iterator[None]:
    """Record ``on_error`` as the call's (unless an outer call already did) for ``on_judge_error="auto"``: what
    :class:`JudgePolicyMixin` does around ``__call__``; a reward's own entry point that does not go through
    ``__call__`` (e.g. a native ``compare``) wraps its body in it."""
    token = _CALL_ON_ERROR.set(on_error) if _CALL_ON_ERROR.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _CALL_ON_ERROR.reset(token)


def call_rows(judge: Any, method: str, conversations: list, *args: Any, isolate: bool, **kwargs: Any):
    """``judge.<method>(conversations, ...)`` -> ``(result, row_errors)``.

    With ``isolate`` (the reward's policy is "nan") and a backend that can fail one request at a time
    (``isolates_rows``, e.g. the OpenAI backend), a request that fails after its retries fails only its row:
    ``row_errors[i]`` holds its message (a NaN row / no texts in the result). Otherwise ``row_errors`` is all
    None and a failure raises as usual (then it fails the whole chunk)."""
    errs: list[str | None] = []
    if isolate and getattr(judge, "isolates_rows", False):
        out = getattr(judge, method)(conversations, *args, row_errors=errs, **kwargs)
        if len(errs) == len(conversations):
            return out, errs
        return out, [None] * len(conversations)
    return getattr(judge, method)(conversations, *args, **kwargs), [None] * len(conversations)


def usable_rows(probs: Any, n_rows: int, n_choices: int, *, atol: float = 1e-3):
    """Validate a ``choice_probs`` result: returns ``(probs [n_rows, n_choices] float32, ok [n_rows] bool)``.

    A row is usable when every entry is finite, in [0, 1] and the row sums to 1 (within ``atol``). A result of
    the wrong shape is a judge failure (:class:`JudgeError`), not an unanswered question.
    """
    import torch

    p = torch.as_tensor(probs, dtype=torch.float32)
    if p.dim() != 2 or tuple(p.shape) != (n_rows, n_choices):
        raise JudgeError(f"choice_probs returned shape {tuple(p.shape)}, expected {(n_rows, n_choices)}")
    finite = torch.isfinite(p).all(1)
    in_range = ((p >= -atol) & (p <= 1 + atol)).all(1)
    sums = torch.where(torch.isfinite(p), p, torch.zeros_like(p)).sum(1)
    ok = finite & in_range & ((sums - 1).abs() <= atol)
    p = torch.where(ok[:, None], p.clamp(0.0, 1.0), torch.full_like(p, math.nan))
    return p, ok
