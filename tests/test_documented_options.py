"""Documented options that had no test (issue 16): each checked against its documented behaviour.

See tests/README.md for the full claim -> test map.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit.compose.composite import Composite
from rewardkit.reward import Reward, RewardBatch, RewardOutput

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_rewardkit_max_pixels_environment_variable():
    """README: the decompression-bomb limit is set with REWARDKIT_MAX_PIXELS (read at import), and
    set_max_pixels(None) restores that value, not PIL's."""
    code = ("import numpy as np\nfrom rewardkit import media\n"
            "print(media.get_max_pixels())\n"
            "media.load_image(np.zeros((10, 10, 3), np.uint8))\n"
            "media.set_max_pixels(5000); media.set_max_pixels(None); print(media.get_max_pixels())\n"
            "try:\n    media.load_image(np.zeros((11, 10, 3), np.uint8))\nexcept Exception as e:\n    print('refused', e)\n")
    env = dict(os.environ, REWARDKIT_MAX_PIXELS="100", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "100" and lines[1] == "100"
    assert lines[2].startswith("refused") and "100" in lines[2]


def test_trust_remote_code_is_off_by_default():
    """README / Security: trust_remote_code is off unless passed."""
    from rewardkit.judges.transformers_backend import TransformersJudge
    from rewardkit.models.clip import CLIPBackbone
    from rewardkit.models.vlm import load_processor

    for fn in (load_processor, CLIPBackbone.__init__, TransformersJudge.__init__):
        assert inspect.signature(fn).parameters["trust_remote_code"].default is False, fn


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
