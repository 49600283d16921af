"""`rewardkit serve` and its client on a tiny checkpoint: start the reward server on 127.0.0.1, score and
compare the example images through `RemoteReward` (the same call and output as in-process), stop.

    python examples/serve_tiny.py                            # the tiny CLIP that `bash scripts/score.sh` writes
    python examples/serve_tiny.py .rewardkit_cache/tiny-clip # or any pickscore checkpoint directory

From a shell the server is `rewardkit serve --reward pickscore --model DIR` (docs/serve.md); here it runs in a
thread of this process (`rewardkit.server.serve_in_thread`, an ephemeral port) so the example ends by itself.
Needs the `serve` extra.
"""

from __future__ import annotations

import sys
from pathlib import Path

import rewardkit
from rewardkit.client import RemoteReward
from rewardkit.server import serve_in_thread

IMAGES = Path(__file__).resolve().parent / "images"


def main(model: str = ".rewardkit_cache/tiny-clip") -> None:
    if not Path(model).is_dir():
        raise SystemExit(f"{model}: no such checkpoint folder (run `bash scripts/score.sh` first, it writes it)")
    server = serve_in_thread(rewardkit.load_reward("pickscore", model=model, device="cpu"))
    try:
        remote = RemoteReward(url=server.url)
        images = [IMAGES / "t2i_red_apple.png", IMAGES / "t2i_house_sunset.png"]
        out = remote(images, "a red apple on a wooden table")
        for im, rec in zip(images, out.records()):
            print(f"{im.name}: {rec}")
        pair = remote.compare(images[:1], images[1:], "a red apple on a wooden table")
        print(f"served by {server.url}: P({images[0].name} preferred) = {float(pair.prob_a[0]):.4f}")
        remote.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main(*sys.argv[1:2])
