"""A scripted pairwise judge for group-reward tests: it answers UnifiedReward-2.0's pairwise format with
``P(image 1) = sigmoid(k (q_1 - q_2)) + bias`` where ``q`` is an image's mean red value in [0, 1] (solid images
make it exact), so the true preference, a planted position bias and judge failures are all known."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from rewardkit.judges import JudgeBackend


def quality(im) -> float:
    return float(np.asarray(im.convert("RGB"), dtype=np.float64)[..., 0].mean() / 255.0)


def solid(values, size=16):
    """Solid images whose red channel is ``round(255 * v)`` (so their quality is that over 255)."""
    return [Image.new("RGB", (size, size), (int(round(255 * v)), 60, 90)) for v in values]


def true_p(q1: float, q2: float, k: float = 3.0) -> float:
    return 1.0 / (1.0 + math.exp(-k * (q1 - q2)))


class QualityJudge(JudgeBackend):
    """Pairwise answers in UnifiedReward-2.0's format; ``fail_below``: a pair whose first image has quality below
    it gets an unparseable answer. Counts generate calls and conversations."""

    kind = "scripted-quality"

    def __init__(self, k: float = 3.0, bias: float = 0.0, fail_below: float | None = None):
        self.k, self.bias, self.fail_below = k, bias, fail_below
        self.calls: list[int] = []
        self.sessions = 0

    def session(self):
        self.sessions += 1
        return super().session()

    def p(self, q1: float, q2: float) -> float:
        return min(max(true_p(q1, q2, self.k) + self.bias, 0.0), 1.0)

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        self.calls.append(len(conversations))
        out = []
        for conv in conversations:
            ims = [c["image"] for c in conv[-1]["content"] if c.get("type") == "image"]
            q1, q2 = quality(ims[0]), quality(ims[1])
            if self.fail_below is not None and q1 < self.fail_below:
                out.append(["I cannot tell."] * n)
                continue
            x = round(self.p(q1, q2), 6)
            y = round(1.0 - x, 6)
            text = "".join(f"{a} Score:\nImage 1: {x}\nImage 2: {y}\n" for a in ("Alignment", "Coherence", "Style"))
            out.append([text] * n)
        return out

    def choice_probs(self, conversations, choices):
        raise NotImplementedError
