"""Composite gates and groups read from the right place: the intent falls back to the constraint reward's cache
where the metadata has none, a custom ``intent_key`` / ``gate_on`` are honoured, and ``group_by`` groups by a
metadata key. Expected scores are computed here from the z-score definition, on inputs where the plausible
wrong code gives a different answer (distinct cached and metadata intents, every prompt distinct)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit.compose.composite import Composite
from rewardkit.reward import Reward, RewardBatch, RewardConfig, RewardOutput


# ------------------------------------------------------------------ composite: intent fallback, group_by metadata
@pytest.fixture
def chan_reward():
    from dataclasses import dataclass

    @dataclass
    class Cfg(RewardConfig):
        channel: int = 0

    class Chan(Reward):
        name = "test-killers-chan"
        Config = Cfg

        def _score(self, batch: RewardBatch) -> RewardOutput:
            return RewardOutput(scores=torch.tensor(
                [float(np.asarray(im)[..., self.config.channel].mean()) / 255.0 for im in batch.images]))

    class CachedIntent(Chan):
        """Stands in for the constraint reward: it knows intents from its cache, by prompt."""

        name = "test-killers-cached"
        uses_prompt = True
        cache = {"p0": "open", "p1": "strict", "p2": None, "p3": "strict", "p4": "neutral"}

        def intent_for(self, prompts):
            return [self.cache.get(p) for p in prompts]

    return Chan, CachedIntent


def _z(x):
    """The composite's default z-score (``zscore="rl"``): (x - mean) / (std + 1e-4), flow_grpo's advantage."""
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean()) / (x.std() + 1e-4)


IMGS = [Image.new("RGB", (4, 4), c) for c in [(200, 10, 0), (100, 200, 40), (50, 10, 90), (150, 220, 255),
                                                  (10, 90, 120)]]
R = np.array([200, 100, 50, 150, 10]) / 255.0
B = np.array([0, 40, 90, 255, 120]) / 255.0


def test_composite_intent_fallback_from_the_constraint_cache(chan_reward):
    Chan, CachedIntent = chan_reward
    comp = Composite(axes=[{"name": "preference"}, {"name": "constraint", "gate": "intent"}],
                     rewards={"preference": Chan(channel=0), "constraint": CachedIntent(channel=2)})
    prompts = ["p0", "p1", "p2", "p3", "p4"]
    meta = [{"intent": "strict"}, {}, {}, {"intent": "open"}, {}]
    out = comp(IMGS, prompts, metadata=meta)
    # metadata wins where given (p0 strict, p3 open); the cache fills the rest (p1 strict, p2 None, p4 neutral)
    intents = ["strict", "strict", None, "open", "neutral"]
    assert [d["intent"] for d in out.details] == intents
    gate = np.array([1.0, 1.0, 0.0, 0.0, 0.0])
    zc = np.zeros(5)
    zc[[0, 1]] = _z(B[[0, 1]])                     # constraint statistics over the open gates only
    want = _z(R) + gate * zc
    np.testing.assert_allclose(out.scores.numpy(), want, atol=1e-5)
    np.testing.assert_array_equal(out.dimensions["constraint/gate"].numpy(), gate)


def test_composite_custom_intent_key_and_gate_on(chan_reward):
    Chan, _ = chan_reward
    comp = Composite(axes=[{"name": "preference"}, {"name": "constraint", "gate": "intent", "weight": 2.0}],
                     rewards={"preference": Chan(channel=0), "constraint": Chan(channel=2)},
                     intent_key="kind", gate_on=["strict", "neutral"])
    meta = [{"kind": "neutral", "intent": "open"}, {"kind": "open", "intent": "strict"}, {"kind": "strict"},
            {"intent": "strict"}, {"kind": "neutral"}]
    out = comp(IMGS, "p", metadata=meta)
    gate = np.array([1.0, 0.0, 1.0, 0.0, 1.0])      # read from "kind"; "intent" is ignored
    zc = np.zeros(5)
    zc[[0, 2, 4]] = _z(B[[0, 2, 4]])
    np.testing.assert_allclose(out.scores.numpy(), _z(R) + 2.0 * gate * zc, atol=1e-5)


def test_composite_group_by_metadata_key(chan_reward):
    Chan, _ = chan_reward
    comp = Composite(axes=[{"name": "preference"}, {"name": "alignment", "weight": 0.5}],
                     rewards={"preference": Chan(channel=0), "alignment": Chan(channel=2)},
                     normalize="group", group_by="scene")
    prompts = ["a", "b", "c", "d", "e"]           # every prompt distinct: grouping by prompt would give all zeros
    meta = [{"scene": 1}, {"scene": 2}, {"scene": 1}, {"scene": 2}, {"scene": 1}]
    out = comp(IMGS, prompts, metadata=meta)
    want = np.zeros(5)
    for idx in ([0, 2, 4], [1, 3]):
        want[idx] = _z(R[idx]) + 0.5 * _z(B[idx])
    np.testing.assert_allclose(out.scores.numpy(), want, atol=1e-5)
    assert np.abs(want).max() > 0.5                 # the grouping is visible in the answer
