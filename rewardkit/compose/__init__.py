"""Reward composition: per-axis z-score, intent gate, detector veto (``Composite``, ``WeightedSum``), rubric
question trees, and LoRA soup (equal-weight averaging of adapter deltas).

Imports are lazy: ``import rewardkit.compose`` loads no model library.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Composite": "rewardkit.compose.composite",
    "CompositeConfig": "rewardkit.compose.composite",
    "WeightedSum": "rewardkit.compose.composite",
    "AxisSpec": "rewardkit.compose.composite",
    "build_composite": "rewardkit.compose.composite",
    "zscore": "rewardkit.compose.functions",
    "group_zscore": "rewardkit.compose.functions",
    "intent_gate": "rewardkit.compose.functions",
    "veto": "rewardkit.compose.functions",
    "additive_penalty": "rewardkit.compose.functions",
    "combine": "rewardkit.compose.functions",
    "lora_soup": "rewardkit.compose.soup",
    "QuestionTree": "rewardkit.compose.rubric",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rewardkit.compose' has no attribute {name!r}")
