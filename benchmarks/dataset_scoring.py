"""Dataset scoring throughput (local engine vs Ray with 1 and 2 actors) and peak memory on a 20,000-row set.

    python benchmarks/dataset_scoring.py                      # rows/s on 1,600 rows, peak RSS at 5,000 / 20,000 rows
    python benchmarks/dataset_scoring.py --rows 800 --mem-rows 2000 20000 --skip-ray
    python benchmarks/dataset_scoring.py --filter-only --before /tmp/before   # filter --group-by memory per row

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
    from rewardkit.datasets import RewardSpec, score_dataset_ray

    t = time.perf_counter()
    s = score_dataset_ray(RewardSpec("pickscore", None, {"model": str(model)}), data, out, batch_size=64,
                          concurrency=actors, progress=False)
    return {"rows": s.rows, "seconds": time.perf_counter() - t}


def make_scored(folder: Path, rows: int, per_shard: int = 50_000, groups: int = 1000) -> tuple[Path, Path]:
    """A Parquet set (a 200-byte stand-in image, a prompt, a caption, a uid) and a scores folder for it written
    by the score writer itself (no model: ``filter`` reads only the score files), ``rows`` rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rewardkit.datasets.output import ShardWriter, check_manifest

    data, scores = folder / "data", folder / "scores"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    desc = {"reward": "bench", "config": {}, "rewardkit_version": "0", "columns": {"prompt": "prompt"},
            "fingerprint": "bench"}
    names = [f"part-{i:05d}" for i in range(-(-rows // per_shard))]
    check_manifest(scores, desc, {"format": "parquet", "inputs": [str(data)], "split": None, "shards": names,
                                  "shard_paths": [str(data / f"{n}.parquet") for n in names]})
    for k, name in enumerate(names):
        n = min(per_shard, rows - k * per_shard)
        uid = np.arange(k * per_shard, k * per_shard + n)
        pq.write_table(pa.table({"uid": uid, "image": [b"x" * 200] * n,
                                 "prompt": [f"a photo of prompt number {u % groups}" for u in uid],
                                 "caption": [f"a long caption of row {u} " * 4 for u in uid]}),
                       data / f"{name}.parquet")
        w = ShardWriter(scores, name, str(data / f"{name}.parquet"), desc, pa.string(), ["aesthetic", "text"])
        for s in range(0, n, 10_000):
            m = min(10_000, n - s)
            sc = rng.normal(size=m)
            w.write([f"{name}:{s + i}" for i in range(m)],
                    [{"score": float(x), "valid": True, "error": None,
                      "dimensions": {"aesthetic": float(x), "text": float(-x)}} for x in sc])
        w.commit()
    return data, scores


FILTER_CHILD = """
import json, sys, time
from rewardkit.datasets import filter_dataset
def hwm():  # this process's own peak (VmHWM starts afresh at exec; ru_maxrss would carry the parent's peak)
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
t = time.perf_counter()
r = filter_dataset(sys.argv[1], sys.argv[2], sys.argv[3], top_k=1, group_by="prompt", progress=False)
print(json.dumps({"kept": r.kept, "total": r.total, "seconds": time.perf_counter() - t, "peak_mb": hwm()}))
"""


def filter_memory(tmp: Path, sizes: list[int], before: str | None = None) -> None:
    """Peak RSS of ``filter --top-k 1 --group-by prompt`` at two set sizes, one fresh process each: the slope
    is the memory the selection holds per row. ``before``: a checkout of older code run on the same files, side
    by side (e.g. ``git worktree add /tmp/before cddc5ed``)."""
    trees = [("this tree", str(ROOT))] + ([("before", before)] if before else [])
    sets = {n: make_scored(tmp / f"f{n}", n) for n in sizes}
    for label, tree in trees:
        env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
        peaks = []
        for n, (data, scores) in sets.items():
            out = tmp / f"fo-{len(peaks)}-{label.replace(' ', '')}-{n}"
            res = subprocess.run([sys.executable, "-c", FILTER_CHILD, str(data), str(scores), str(out)],
                                 env=env, capture_output=True, text=True, check=True, cwd=tmp)  # (cwd: no tree)
            m = json.loads(res.stdout.strip().splitlines()[-1])
            peaks.append(m["peak_mb"])
            print(f"[{label}] filter --top-k 1 --group-by prompt, {n:,} rows: peak RSS {m['peak_mb']:.0f} MB, "
                  f"kept {m['kept']}, {m['seconds']:.1f} s")
        if len(sizes) > 1:
            slope = (peaks[-1] - peaks[0]) * 1024 * 1024 / (sizes[-1] - sizes[0])
            print(f"[{label}] filter memory per row: {slope:.0f} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1600, help="rows for the throughput runs")
    ap.add_argument("--mem-rows", type=int, nargs="+", default=[5000, 20000], help="set sizes for peak memory")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--filter-rows", type=int, nargs="+", default=[100_000, 400_000],
                    help="set sizes for the filter memory figure")
    ap.add_argument("--filter-only", action="store_true", help="only the filter memory figure")
    ap.add_argument("--before", help="a checkout of older code to run the filter figure on too, side by side")
    args = ap.parse_args()
    from rewardkit.testing import save_tiny_checkpoint

    if args.filter_only:
        with tempfile.TemporaryDirectory() as tmp:
            filter_memory(Path(tmp), args.filter_rows, args.before)
        return

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
        filter_memory(tmp, args.filter_rows, args.before)


if __name__ == "__main__":
    main()
