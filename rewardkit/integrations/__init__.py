"""Adapters that turn any rewardkit reward into the callable an external RL trainer expects.

One module per host, each returning exactly the host's reward callable (same argument names, same return
shape), with an explicit NaN policy (``raise`` by default, ``fill``, or ``mask`` where the host can mask):

=========================  ==========================================================================
``flow_grpo``              ``flow_grpo_scorer`` (``fn(images, prompts, metadata) -> (scores, info)``),
                           ``multi_score(device, {name: weight})`` (flow_grpo / DiffusionNFT)
``trl``                    ``trl_reward_func`` (TRL ``GRPOTrainer`` reward functions, sync or async)
``verl``                   ``verl_compute_score`` (verl-omni ``compute_score``, optional micro-batching)
``ddpo``                   ``ddpo_reward_fn`` (legacy DDPO / AlignProp ``(images, prompts, metadata)``)
=========================  ==========================================================================

Adapters use only the public :class:`~rewardkit.Reward` call, so any ``Reward`` (local, composite, remote)
works unchanged. Nothing heavy is imported until an adapter is built. See ``docs/integrations.md``.
"""

from __future__ import annotations

from .._imports import lazy_getattr

_LAZY = {
    "flow_grpo_scorer": "rewardkit.integrations.flow_grpo",
    "flow_grpo_factory": "rewardkit.integrations.flow_grpo",
    "multi_score": "rewardkit.integrations.flow_grpo",
    "trl_reward_func": "rewardkit.integrations.trl",
    "verl_compute_score": "rewardkit.integrations.verl",
    "ddpo_reward_fn": "rewardkit.integrations.ddpo",
    "NonFiniteRewardError": "rewardkit.integrations._common",
    "NAN_POLICIES": "rewardkit.integrations._common",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr('rewardkit.integrations', _LAZY, globals())
