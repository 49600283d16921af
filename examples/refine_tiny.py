"""Generate-critique-refine (`rewardkit refine`, docs/parrot.md) end to end, offline, in seconds.

    python examples/refine_tiny.py outputs/refine

The generator is a plain function (a dark or a bright picture, brighter when the request asks for "well lit"),
and the critic is the `rational` reward on rewardkit's scripted PARROT teacher (it rates an image by its
brightness and writes a refined request). The loop is the real one: critique, refine the request where a
dimension is below 3, regenerate, critique again, write before / after images and records.jsonl. With a real
pipeline and a trained RationalRewards student, the same run is
`rewardkit refine --generator diffusers:DIR --critic-model STUDENT --prompt ... -o OUT`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from rewardkit import media
from rewardkit.parrot.testing import ScriptedTeacher
from rewardkit.refine import refine
from rewardkit.rewards.rational import RationalReward


def generate(prompts, sources=None, seed=None):
    """A stand-in text-to-image model: a grey picture, light when the request asks for light."""
    level = lambda p: 230 if "well lit" in p else 40  # noqa: E731
    return [Image.fromarray(np.full((64, 64, 3), level(p), dtype=np.uint8)) for p in prompts]


def main(out: str = "outputs/refine") -> None:
    critic = RationalReward(judge=ScriptedTeacher())
    res = refine(generate, ["a cat on a sofa", "a lighthouse at dusk"], critic=critic)
    folder = Path(out)
    for sub in ("before", "after"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    with open(folder / "records.jsonl", "w", encoding="utf-8") as f:
        for i, (rec, b, a) in enumerate(zip(res.records, res.images_before, res.images_after)):
            media.to_pil(b).save(folder / "before" / f"{i:05d}.png")
            media.to_pil(a).save(folder / "after" / f"{i:05d}.png")
            f.write(json.dumps({"index": i, **rec}) + "\n")
            print(f"{rec['prompt']!r}: {rec['status']}, score {rec['score_before']:.3f} -> {rec['score_after']:.3f}"
                  + (f" (refined request: {rec['refined_prompts'][-1]!r})" if rec.get("refined_prompts") else ""))
    print(f"wrote {folder}/before, {folder}/after and {folder}/records.jsonl")


if __name__ == "__main__":
    main(*sys.argv[1:2])
