"""The legacy DDPO / AlignProp reward shape: ``reward_fn(images, prompts, prompt_metadata) -> (rewards, metadata)``.

TRL <= 0.23's ``DDPOTrainer`` and ``AlignPropTrainer`` (removed in TRL 0.24; still used by forks and by
trainers that copied the convention) call ``reward_function(images, prompts, prompt_metadata)`` with a float
NCHW tensor in [0, 1] and tuples of prompts / per-prompt dicts, and read ``(rewards, reward_metadata)``.
AlignProp back-propagates ``10 - rewards.mean()`` into the pixels: that needs a reward whose
``differentiable`` is True (``alignprop=True`` checks it and keeps the graph).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..reward import RewardOutput
from ._common import LazyReward, _check_policy, apply_nan_policy, refuse_batch_relative

__all__ = ["ddpo_reward_fn"]

_HOST = "DDPO"


class _DDPOReward:
    def __init__(self, handle: LazyReward, nan_policy: str, fill_value: float | None, batch_size: int | None,
                 alignprop: bool, allow_batch_relative: bool):
        self.handle = handle
        self.nan_policy = nan_policy
        self.fill_value = fill_value
        self.batch_size = batch_size
        self.alignprop = alignprop
        self.allow_batch_relative = allow_batch_relative
        self.__name__ = handle.name

    def __call__(self, images: Any, prompts: Any, prompt_metadata: Any = None) -> tuple[torch.Tensor, dict[str, Any]]:
        reward = self.handle.get()
        refuse_batch_relative(reward, _HOST, self.allow_batch_relative)
        if self.alignprop and not reward.differentiable:
            raise TypeError(f"AlignProp back-propagates the reward into the images, but reward {self.handle.name!r} "
                            "is not differentiable w.r.t. pixels (Reward.differentiable is False); use DDPO instead")
        if isinstance(prompts, str):
            prompts = [prompts]
        metas = None
        if prompt_metadata is not None:
            metas = list(prompt_metadata)
            if not any(metas):
                metas = None
        if self.alignprop:
            # Gradients to pixels go through Reward.score_tensor (ordinary calls run in inference mode);
            # it refuses bad inputs loudly, and a non-finite score follows the NaN policy below.
            scores = reward.score_tensor(images, list(prompts), batch_size=self.batch_size)
            out = RewardOutput(scores=scores.detach().float().cpu())
            _, report = apply_nan_policy(out, host=_HOST, name=self.handle.name, nan_policy=self.nan_policy,
                                         fill_value=self.fill_value)
            ok = torch.isfinite(scores.detach())
            rewards = torch.where(ok, scores, torch.full_like(scores, float(self.fill_value or 0.0)))
            return rewards, report
        out = reward(images, list(prompts), metadata=metas, batch_size=self.batch_size, on_error="nan")
        values, report = apply_nan_policy(out, host=_HOST, name=self.handle.name, nan_policy=self.nan_policy,
                                          fill_value=self.fill_value)
        rewards = torch.tensor(values, dtype=torch.float32)
        return rewards, report


def ddpo_reward_fn(reward: Any, device: Any = None, *, nan_policy: str = "raise", fill_value: float | None = None,
                   batch_size: int | None = None, alignprop: bool = False, allow_batch_relative: bool = False,
                   **reward_kwargs: Any) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    """A rewardkit reward as a DDPO / AlignProp ``reward_function``.

    Returns ``fn(images, prompts, prompt_metadata) -> (rewards float32 [B], {"valid_fraction", ...})``.
    ``nan_policy``: ``"raise"`` (default) or ``"fill"`` (``fill_value``). ``alignprop=True`` requires a
    differentiable reward and returns scores that carry the graph back to ``images``.

    Example::

        from trl import DDPOTrainer          # TRL <= 0.23
        from rewardkit.integrations.ddpo import ddpo_reward_fn
        trainer = DDPOTrainer(config, ddpo_reward_fn("pickscore", device=0), prompt_fn, pipeline)
    """
    fill = _check_policy(nan_policy, fill_value, mask_ok=False, host=_HOST)
    return _DDPOReward(LazyReward(reward, device, reward_kwargs), nan_policy, fill, batch_size, alignprop,
                       allow_batch_relative)
