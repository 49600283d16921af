"""Reward composition: per-axis z-score, intent gate, detector veto (``Composite``, ``WeightedSum``), rubric
question trees, and LoRA soup (equal-weight averaging of adapter deltas).

Imports are lazy: ``import rewardkit.compose`` loads no model library.
"""

from __future__ import annotations

from .._imports import lazy_getattr

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
    "GroupReward": "rewardkit.compose.group",
    "GroupRewardConfig": "rewardkit.compose.group",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr('rewardkit.compose', _LAZY, globals())
