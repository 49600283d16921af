"""Peak memory of one large reward call: decode per chunk (now) vs decode everything first (before).

    python benchmarks/memory_per_chunk.py [--n 1000] [--size 512] [--batch-size 32]

Writes ``n`` JPEG files of ``size`` x ``size`` to a temp folder, then scores them in one call at
``batch_size`` with a trivial reward (mean pixel: the cost is rewardkit's input plumbing only), each variant
in a fresh subprocess, and prints the peak RSS (``ru_maxrss``) and its growth over the RSS just before the
call. "before" runs the original ``Reward.__call__`` (``rewardkit/reward.py`` at commit ``BEFORE``, read
with ``git show``), which decoded every image before the first chunk; "after" is the working tree.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

BEFORE = "97e4613"  # last commit with the eager decode
ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(variant: str, folder: str, batch_size: int) -> None:
    import numpy as np
    import torch

    if variant == "before":
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:rewardkit/reward.py"], check=True,
                             capture_output=True, text=True).stdout
        path = Path(tempfile.mkdtemp()) / "reward_before.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("rewardkit._reward_before", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    else:
        import rewardkit.reward as mod

    class MeanPixel(mod.Reward):
        name = "mean-pixel"

        def _score(self, batch):
            return mod.RewardOutput(scores=torch.tensor([float(np.asarray(im).mean()) for im in batch.images]))

    files = sorted(str(p) for p in Path(folder).glob("*.jpg"))
    r = MeanPixel()
    r([files[0]], "warm-up")
    base = _rss_mb()
    out = r(files, "a prompt", batch_size=batch_size)
    assert bool(out.valid.all())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"variant": variant, "rss_before_call_mb": base, "peak_rss_mb": peak, "growth_mb": peak - base}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "FOLDER"))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.batch_size)
        return
    import numpy as np
    from PIL import Image

    with tempfile.TemporaryDirectory() as folder:
        rng = np.random.default_rng(0)
        yy, xx = np.mgrid[0:a.size, 0:a.size] / a.size
        for i in range(a.n):  # smooth images: small files, full-size decodes
            c = rng.uniform(0, 1, 3)
            arr = np.stack([(np.sin(6 * xx * c[0] + 3 * yy * c[1] + i) + 1) * 127, xx * 255, yy * 255 * c[2]], -1)
            Image.fromarray(arr.astype(np.uint8), "RGB").save(f"{folder}/{i:05d}.jpg", quality=85)
        decoded_mb = a.n * a.size * a.size * 3 / 2**20
        print(f"{a.n} JPEGs of {a.size}x{a.size} ({decoded_mb:.0f} MB decoded), batch_size={a.batch_size}; "
              f"one chunk of decoded images = {a.batch_size * a.size * a.size * 3 / 2**20:.0f} MB")
        rows = []
        for variant in ("before", "after", "before", "after"):
            res = subprocess.run([sys.executable, __file__, "--child", variant, folder, "--batch-size",
                                  str(a.batch_size)], check=True, capture_output=True, text=True, timeout=600)
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]))
        for v in ("before", "after"):
            g = [r["growth_mb"] for r in rows if r["variant"] == v]
            p = [r["peak_rss_mb"] for r in rows if r["variant"] == v]
            print(f"{v:>6}: peak RSS {min(p):.0f}-{max(p):.0f} MB, growth during the call {min(g):.0f}-{max(g):.0f} MB")


if __name__ == "__main__":
    main()
