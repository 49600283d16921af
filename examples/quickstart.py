"""Quickstart that runs anywhere, offline: score and compare images with PickScore's code path.

    python examples/quickstart.py                       # a tiny random checkpoint (meaningless numbers)
    python examples/quickstart.py /models/PickScore_v1  # real weights in a local directory

The tiny checkpoint is written by rewardkit.testing.save_tiny_checkpoint, so the whole path (from_pretrained,
processor, batching, output) is the one real weights take.
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import rewardkit
from rewardkit.testing import save_tiny_checkpoint


def main(model_dir: str | None = None) -> None:
    if model_dir is None:
        model_dir = str(save_tiny_checkpoint("pickscore", Path(tempfile.mkdtemp()) / "tiny-pickscore"))
    reward = rewardkit.load_reward("pickscore", model=model_dir, device="cpu")

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(3)]
    images.append(b"this is not an image")  # a bad sample: NaN + a reason, the others still scored

    out = reward(images, "a watercolor fox in the snow", on_error="nan")
    for i, rec in enumerate(out.records()):
        print(i, rec)

    pair = reward.compare(images[:1], images[1:2], "a watercolor fox in the snow")
    print("P(image 0 preferred over image 1) =", round(float(pair.prob_a[0]), 4))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
