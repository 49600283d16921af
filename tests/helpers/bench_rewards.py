"""Deterministic test rewards shared by the bench and view tests (pixel statistics; no model)."""

from __future__ import annotations

import numpy as np
import torch

from rewardkit.reward import Reward, RewardBatch, RewardOutput


def brightness(im) -> float:
    return float(np.asarray(im, dtype=np.float32).mean() / 255.0)


class MeanPixel(Reward):
    """Mean pixel value; counts the samples it scores."""

    name = "test-meanpixel"
    tasks = frozenset({"t2i", "edit"})
    thread_safe = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.n_scored = 0
        self.fail_after_calls: int | None = None
        self.calls = 0

    def _score(self, batch: RewardBatch) -> RewardOutput:
        self.calls += 1
        if self.fail_after_calls is not None and self.calls > self.fail_after_calls:
            raise KeyboardInterrupt  # an interrupted run
        self.n_scored += len(batch)
        return RewardOutput(scores=torch.tensor([brightness(im) for im in batch.images]))
