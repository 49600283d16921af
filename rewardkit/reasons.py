"""Per-sample reasons (the ``errors`` of an output): joining labelled parts into one reason, and the prefix that
marks a judge failure. Shared by the contract (:meth:`rewardkit.reward.Reward.compare`), the judges' failure
policy (:mod:`rewardkit.judges.policy`, which re-exports both names) and the rewards built on them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["JUDGE_FAILURE_PREFIX", "join_reasons"]

#: every reason a judge failure produces starts with this (callers that cache results, e.g. a benchmark score
#: cache, can recognise a transient failure and not store it)
JUDGE_FAILURE_PREFIX = "judge call failed"


def join_reasons(parts: Any) -> str | None:
    """One sample's reason from labelled parts ``[(label, reason or None), ...]``: ``"label: reason; ..."``,
    None when every reason is None. Judge failures come first as ``"judge call failed (label): ..."``, so that a
    combined reason holding a failure still starts with :data:`JUDGE_FAILURE_PREFIX` (a score cache must not
    store it: the next run asks again)."""
    fails, others = [], []
    for label, reason in parts:
        if not reason:
            continue
        if reason.startswith(JUDGE_FAILURE_PREFIX):
            fails.append(f"{JUDGE_FAILURE_PREFIX} ({label}){reason[len(JUDGE_FAILURE_PREFIX):]}")
        else:
            others.append(f"{label}: {reason}")
    return "; ".join(fails + others) or None
