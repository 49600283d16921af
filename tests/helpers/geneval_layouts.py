"""GenEval test data: a small generated prompt metadata file, images in the official layout, and a stand-in
``geneval`` reward with the real reward's per-sample details (for the bench before the reward is merged)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from rewardkit.reward import Reward, RewardOutput

#: six prompts, one per tag, in GenEval's metadata format (prompts/evaluation_metadata.jsonl)
METADATA = [
    {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
    {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}],
     "prompt": "a photo of a cat and a dog"},
    {"tag": "counting", "include": [{"class": "apple", "count": 3}], "exclude": [{"class": "apple", "count": 4}],
     "prompt": "a photo of three apples"},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a photo of a red car"},
    {"tag": "position", "include": [{"class": "cup", "count": 1}, {"class": "bowl", "count": 1,
                                                                    "position": ["left of", 0]}],
     "prompt": "a photo of a bowl left of a cup"},
    {"tag": "color_attr", "include": [{"class": "giraffe", "count": 1, "color": "brown"},
                                      {"class": "stop sign", "count": 1, "color": "white"}],
     "prompt": "a photo of a brown giraffe and a white stop sign"},
]


def write_metadata(path: Path, rows=METADATA) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_layout(root: Path, brightness: list[list[int]], rows=METADATA) -> Path:
    """``root/<index:05>/{metadata.jsonl, samples/<k:05>.png}`` (generation/diffusers_generate.py:118-146), one
    flat grey image per entry of ``brightness[index]`` (the stand-in reward calls a bright image correct)."""
    from PIL import Image

    for i, levels in enumerate(brightness):
        d = root / f"{i:0>5}"
        (d / "samples").mkdir(parents=True, exist_ok=True)
        (d / "metadata.jsonl").write_text(json.dumps(rows[i]), encoding="utf-8")
        for k, v in enumerate(levels):
            Image.new("RGB", (16, 16), (v, v, v)).save(d / "samples" / f"{k:05}.png")
    return root


class BrightIsCorrect(Reward):
    """Stand-in for ``geneval``: an image is ``correct`` when its mean is above 127 and ``strict_correct`` when
    above 200; the details carry the official record fields. Records the metadata it was given."""

    name = "bright-is-correct"
    uses_prompt = False
    seen: list = []

    def _score(self, batch):
        details, scores = [], []
        for im, meta in zip(batch.images, batch.metadata):
            BrightIsCorrect.seen.append(meta)
            m = float(np.asarray(im.convert("L"), dtype=np.float64).mean())
            details.append({"tag": meta["tag"], "prompt": meta["prompt"], "correct": m > 127,
                            "strict_correct": m > 200, "score": m / 255,
                            "reason": "" if m > 127 else "expected it bright",
                            "metadata": json.dumps(meta), "details": {"bench": [[0.0, 0.0, 4.0, 4.0, 0.9]]}})
            scores.append(1.0 if m > 127 else 0.0)
        return RewardOutput(scores=torch.tensor(scores), details=details)

    @classmethod
    def tiny(cls, workdir):
        return cls()


def register_bright(monkeypatch) -> str:
    """Register :class:`BrightIsCorrect` as ``bright-is-correct`` for one test (a CLI run finds it by name); the
    registry's run-time registrations and cache are restored afterwards, so ``rewardkit ls`` never lists it."""
    from rewardkit import registry

    monkeypatch.setattr(registry, "_programmatic", dict(registry._programmatic))
    monkeypatch.setattr(registry, "_registry", None)
    registry.register_reward("bright-is-correct", BrightIsCorrect)
    BrightIsCorrect.seen.clear()
    return "bright-is-correct"
