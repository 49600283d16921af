"""rewardkit: one stable ``Reward`` interface over every kind of visual reward.

    >>> import rewardkit
    >>> reward = rewardkit.load_reward("pickscore")          # or a local directory: model="/path"
    >>> out = reward(images, "a photo of a cat")              # RewardOutput
    >>> out.scores, out.valid, out.errors

Attributes are imported lazily so that ``import rewardkit`` stays cheap and never imports
transformers, diffusers, peft, trl, vllm or datasets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._imports import lazy_getattr
from ._version import __version__

__all__ = [
    "Reward",
    "RewardOutput",
    "PairwiseOutput",
    "RewardBatch",
    "RewardConfig",
    "RewardInputError",
    "MissingDependencyError",
    "load_reward",
    "list_rewards",
    "register_reward",
    "GroupReward",
    "__version__",
]

_LAZY = {
    "Reward": "rewardkit.reward",
    "RewardOutput": "rewardkit.reward",
    "PairwiseOutput": "rewardkit.reward",
    "RewardBatch": "rewardkit.reward",
    "RewardConfig": "rewardkit.reward",
    "RewardInputError": "rewardkit.errors",
    "MissingDependencyError": "rewardkit.errors",
    "load_reward": "rewardkit.registry",
    "list_rewards": "rewardkit.registry",
    "register_reward": "rewardkit.registry",
    "GroupReward": "rewardkit.compose.group",
}

if TYPE_CHECKING:  # pragma: no cover
    from .errors import MissingDependencyError, RewardInputError
    from .compose.group import GroupReward
    from .registry import list_rewards, load_reward, register_reward
    from .reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput


__getattr__ = lazy_getattr('rewardkit', _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
