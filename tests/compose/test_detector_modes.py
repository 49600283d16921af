"""The composite's detector modes as docs/compose.md states them: ``veto`` with its ``strength``
(z' = z - v * fired * max(z, 0)) and ``additive`` with its ``penalty``. Expected scores are computed here from
the z-score definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit.compose.composite import Composite
from rewardkit.reward import Reward, RewardBatch, RewardOutput


class _Red(Reward):
    name = "test-docopts-red"

    def _score(self, batch: RewardBatch) -> RewardOutput:
        return RewardOutput(scores=torch.tensor([float(np.asarray(im)[..., 0].mean()) / 255 for im in batch.images]))


class _Green(Reward):
    """Fires (1.0) when the green mean is above 0.5."""

    name = "test-docopts-green"

    def _score(self, batch: RewardBatch) -> RewardOutput:
        return RewardOutput(scores=torch.tensor([float(np.asarray(im)[..., 1].mean() / 255 > 0.5)
                                                 for im in batch.images]))


IMGS = [Image.new("RGB", (4, 4), c) for c in [(200, 10, 0), (100, 200, 0), (50, 10, 0), (150, 220, 255)]]
RED = np.array([200, 100, 50, 150]) / 255
FIRED = np.array([0.0, 1.0, 0.0, 1.0])


def _z(x):  # the composite's default z-score (zscore="rl")
    return (x - x.mean()) / (x.std() + 1e-4)


@pytest.mark.parametrize("strength", [0.0, 0.5, 1.0])
def test_detector_veto_strength(strength):
    """docs/compose.md: detectors.strength is v in z' = z - v * fired * max(z, 0)."""
    comp = Composite(axes=[{"name": "preference"}], rewards={"preference": _Red(), "detectors": _Green()},
                     detectors={"mode": "veto", "strength": strength})
    out = comp(IMGS, "p")
    z = _z(RED)
    want = z - strength * FIRED * np.maximum(z, 0)
    np.testing.assert_allclose(out.scores.numpy(), want, atol=1e-5)
    assert z[3] > 0   # sample 3 fired with a positive z: the strength is visible in the answer


def test_detector_additive_penalty_value():
    """docs/compose.md: mode=additive subtracts penalty * fired (also from negative z-scores)."""
    comp = Composite(axes=[{"name": "preference"}], rewards={"preference": _Red(), "detectors": _Green()},
                     detectors={"mode": "additive", "penalty": 0.75})
    np.testing.assert_allclose(comp(IMGS, "p").scores.numpy(), _z(RED) - 0.75 * FIRED, atol=1e-5)
