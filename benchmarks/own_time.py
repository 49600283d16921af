"""rewardkit's own time per call (issue 41, item 4): a reward call with its heavy steps replaced by their results.

    python benchmarks/own_time.py                          # aesthetic, hpsv2, imagereward; batch 1
    python benchmarks/own_time.py --models hpsv2 --batch 8 --calls 1000

On the tiny checkpoints ``benchmarks/peers.py`` writes (``--work``, default ``~/.cache/rewardkit/peers/work``; run
peers.py once first), one PNG path per image and one prompt, one torch thread. The decoding (``media._to_pil``,
with the header checks it runs for a one-chunk call), the pixel recipes, the direct vision forwards and every other
module forward and ``get_text_features`` of the reward return the result of their first call, so what is timed is
everything else a call does: the input checks, prompts and cached tokens, batching, the torch glue between the
steps, the checked output. Printed: the median CPU time per call (``time.process_time``) with warm caches (calls
back to back) and cold (16 MiB of other memory read before each call, as a real decode and forward evict the
call's code and data from a core's caches), alternated call by call in one process.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import _modules  # noqa: E402 - the torch modules a reward holds, as peers.py's profile finds them

HEAVY = (("rewardkit.media", "_to_pil"), ("rewardkit.models.zoo", "openai_clip_pixels"),
         ("rewardkit.models.zoo", "hpsv2_pixels"), ("rewardkit.models.direct_forward", "clip_image_features"),
         ("rewardkit.models.direct_forward", "blip_vision_states"),
         ("rewardkit.models.direct_forward", "blip_text_states"))
PROMPT = "a photo of a cat sitting on a mat"


def _replay(fn, key, cache):
    def first_result(*a, **k):
        if key not in cache:
            cache[key] = fn(*a, **k)
        return cache[key]
    return first_result


def measure(model: str, work: Path, batch: int, calls: int) -> dict:
    import numpy as np
    import torch

    from rewardkit import load_reward

    reward = load_reward(model, model=str(work / model / "converted"), device="cpu")
    paths = sorted(glob.glob(str(work / "peers-images" / "mixed_*")))[:batch]
    if len(paths) < batch:
        sys.exit(f"own_time: fewer than {batch} images under {work}/peers-images (run benchmarks/peers.py first)")
    cache: dict = {}
    for mod_name, name in HEAVY:
        mod = importlib.import_module(mod_name)
        if hasattr(mod, name):
            setattr(mod, name, _replay(getattr(mod, name), name, cache))
    for root in _modules(reward):
        for m in (root, *root.children()):
            for meth in ("forward", "get_text_features"):
                if hasattr(m, meth):
                    setattr(m, meth, _replay(getattr(m, meth), (id(m), meth), cache))
    other = np.ones(16 * 2**20 // 8)
    reward(paths, PROMPT)  # fills the results
    times: dict = {"warm": [], "cold": []}
    for _ in range(calls):
        for mode in ("warm", "cold"):
            if mode == "cold":
                other.sum()
                other[::8] += 1.0
            t0 = time.process_time()
            reward(paths, PROMPT)
            times[mode].append(time.process_time() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="aesthetic,hpsv2,imagereward")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "rewardkit" / "peers" / "work"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    import os
    import subprocess

    import torch

    torch.set_num_threads(1)
    models = a.models.split(",")
    if not a.child:
        print(f"load average {os.getloadavg()[0]:.1f}; batch {a.batch}; median CPU time per call over {a.calls} calls")
    if len(models) > 1:  # one process per model: the replaced functions are module globals
        for m in models:
            subprocess.run([sys.executable, __file__, "--child", "--models", m, "--batch", str(a.batch),
                            "--calls", str(a.calls), "--work", a.work], check=True)
        return 0
    r = measure(models[0], Path(a.work), a.batch, a.calls)
    print(f"{models[0]:12s} own time per call: warm {r['warm'] * 1e6:6.0f} us, cold {r['cold'] * 1e6:6.0f} us",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
