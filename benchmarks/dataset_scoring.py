"""Dataset scoring throughput (local engine vs Ray with 1 and 2 actors) and peak memory on a 20,000-row set.

    python benchmarks/dataset_scoring.py                      # rows/s on 1,600 rows, peak RSS at 5,000 / 20,000 rows
    python benchmarks/dataset_scoring.py --rows 800 --mem-rows 2000 20000 --skip-ray

Tiny CLIP (``rewardkit.testing``) scored as PickScore, 64x64 PNG images in Parquet shards of 400 rows, batch 64.
Each memory figure is one fresh process (``ru_maxrss`` of the child), so the numbers do not share an
interpreter: a peak that stays flat from 5,000 to 20,000 rows is memory bounded by the batch, not the set.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_set(folder: Path, rows: int, per_shard: int = 400, size: int = 64) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    total = 0
    for s in range(0, rows, per_shard):
        imgs = []
        for _ in range(min(per_shard, rows - s)):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
            imgs.append(buf.getvalue())
        total += sum(map(len, imgs))
        pq.write_table(pa.table({"image": imgs, "prompt": [f"prompt {i % 50}" for i in range(len(imgs))]}),
                       folder / f"part-{s // per_shard:05d}.parquet")
    return total


CHILD = """
import json, resource, sys, time
from rewardkit import load_reward
from rewardkit.datasets import score_dataset
r = load_reward("pickscore", model=sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
s = score_dataset(r, sys.argv[2], sys.argv[3], batch_size=64, progress=False)
print(json.dumps({"rows": s.rows, "seconds": time.perf_counter() - t, "rss_before_mb": before / 1024,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def local_child(model: Path, data: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", CHILD, str(model), str(data), str(out)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def ray_run(model: Path, data: Path, out: Path, actors: int) -> dict:
    from rewardkit.integrations.ray import RewardSpec, score_dataset_ray

    t = time.perf_counter()
    s = score_dataset_ray(RewardSpec("pickscore", None, {"model": str(model)}), data, out, batch_size=64,
                          concurrency=actors, progress=False)
    return {"rows": s.rows, "seconds": time.perf_counter() - t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1600, help="rows for the throughput runs")
    ap.add_argument("--mem-rows", type=int, nargs="+", default=[5000, 20000], help="set sizes for peak memory")
    ap.add_argument("--skip-ray", action="store_true")
    args = ap.parse_args()
    from rewardkit.testing import save_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = save_tiny_checkpoint("clip", tmp / "clip")
        make_set(tmp / "speed", args.rows)
        loc = local_child(model, tmp / "speed", tmp / "o-local")
        print(f"local: {loc['rows']} rows in {loc['seconds']:.1f} s = {loc['rows'] / loc['seconds']:.1f} rows/s")
        if not args.skip_ray:
            import ray

            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
            for actors in (1, 2):
                r = ray_run(model, tmp / "speed", tmp / f"o-ray{actors}", actors)
                print(f"ray, {actors} actor(s): {r['rows']} rows in {r['seconds']:.1f} s = "
                      f"{r['rows'] / r['seconds']:.1f} rows/s (incl. actor start)")
            ray.shutdown()
        for n in args.mem_rows:
            size = make_set(tmp / f"mem{n}", n)
            m = local_child(model, tmp / f"mem{n}", tmp / f"o-mem{n}")
            print(f"memory, {n} rows ({size / 1e6:.0f} MB of PNG): peak RSS {m['peak_mb']:.0f} MB (after loading "
                  f"the model: {m['rss_before_mb']:.0f} MB); {m['rows'] / m['seconds']:.1f} rows/s")


if __name__ == "__main__":
    main()
