"""integrations/flow_grpo.py's smaller contracts (found by mutation testing, issue 39): its refusals and their
messages, and the names its callables carry. The drop-in's scores and scales are checked against flow_grpo's
code in test_flow_grpo.py; its host call shapes in test_adapters.py and test_group_hosts.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rewardkit.integrations.flow_grpo import flow_grpo_factory, flow_grpo_scorer, multi_score
from rewardkit.reward import Reward, RewardBatch, RewardOutput


class Red(Reward):
    """The mean of the red channel in [0, 1]."""

    name = "test-red"
    thread_safe = True

    def _score(self, batch: RewardBatch) -> RewardOutput:
        return RewardOutput(scores=torch.tensor([float(np.asarray(im)[..., 0].mean()) / 255.0 for im in batch.images]))


def images(n=2):
    x = torch.zeros(n, 3, 8, 8)
    x[:, 0] = torch.tensor([51, 204][:n], dtype=torch.float32).view(n, 1, 1) / 255.0   # red 0.2 and 0.8
    return x


def test_one_metadata_dict_is_refused_with_its_keys_and_an_empty_one_means_none():
    """flow_grpo passes a tuple of per-prompt dicts; one dict (a common mistake: the metadata of one prompt) is
    refused with its first keys, sorted; ``{}`` (flow_grpo's own examples) means "no metadata".
    Bug caught: the message changed (a user grepping for "prompt_metadata" in the docs finds it)."""
    want = ("metadata must be a sequence of per-sample dicts (flow_grpo's prompt_metadata), got one dict with keys "
            "['a', 'b', 'c', 'd', 'e']")
    meta = {k: 1 for k in "gfedcba"}
    for fn in (flow_grpo_scorer(Red()), lambda *a: multi_score("cpu", {"r": 1.0}, rewards={"r": Red()})(*a)):
        with pytest.raises(TypeError, match=f"^{re.escape(want)}$"):
            fn(images(), ("a", "b"), meta)
    scores, _ = flow_grpo_scorer(Red())(images(), ("a", "b"), {})
    assert scores.tolist() == pytest.approx([0.2, 0.8])


def test_reward_options_for_a_reward_instance_are_refused():
    """``reward_kwargs`` build a reward by name; for a name that ``rewards`` maps to an instance (used as
    configured) they cannot apply, and are refused rather than dropped.
    Bug caught: multi_score looking up the instance's options under another key (they were silently ignored)."""
    with pytest.raises(TypeError, match=re.escape("reward options ['scale'] were given with a reward instance")):
        multi_score("cpu", {"r": 1.0}, rewards={"r": Red()}, reward_kwargs={"r": {"scale": 2.0}})
    details, _ = multi_score("cpu", {"r": 2.0}, rewards={"r": Red()}, reward_kwargs={"r": {}})(images(), ("a", "b"),
                                                                                                None)
    assert details["avg"].tolist() == pytest.approx([0.4, 1.6])


def test_callable_names():
    """The names hosts show in logs and tracebacks: ``rewardkit_multi_score``; a factory ``rewardkit_<name>``
    for a registry name or a reward's ``name``, and ``rewardkit_reward`` for an object without one, which is
    refused when the host calls the factory (the clear TypeError), not when it is registered.
    Bugs caught: the multi_score name changed; the fallback name lost (``rewardkit_None``, or an AttributeError at
    registration)."""
    assert multi_score("cpu", {"r": 1.0}, rewards={"r": Red()}).__name__ == "rewardkit_multi_score"
    assert flow_grpo_factory("pickscore").__name__ == "rewardkit_pickscore"
    assert flow_grpo_factory(Red()).__name__ == "rewardkit_test-red"

    class Anonymous:
        def __call__(self, images, prompts):
            return [0.0] * len(images)

    factory = flow_grpo_factory(Anonymous())
    assert factory.__name__ == "rewardkit_reward"
    with pytest.raises(TypeError, match="^reward must be a rewardkit Reward or a registry name, got Anonymous$"):
        factory("cpu")
