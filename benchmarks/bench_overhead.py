"""Harness overhead of ``rewardkit.bench.evaluate``: everything but the reward's own time.

Scores the synthetic fixtures (all seven benchmark subsets, real hub schemas) with the tiny CLIP reward and
prints the split of wall time between the reward (its ``__call__``: input decoding + model) and the harness
(data loading, hashing, cache, metrics with bootstrap CIs, records). Target: harness < 10% of the total on
a cold run. A warm re-run (every score cached) is timed too: that is what a new metric costs.

    python benchmarks/bench_overhead.py [--pairs 64] [--image-size 224] [--bootstrap 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=64, help="comparisons per pairwise subset (default 64)")
    ap.add_argument("--groups", type=int, default=16, help="groups per EditReward K=3/K=4 subset")
    ap.add_argument("--image-size", type=int, default=224, help="side of the synthetic PNGs (default 224)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3, help="cold runs; the median is reported")
    args = ap.parse_args()

    from rewardkit.bench import evaluate
    from rewardkit.bench.synthetic import SYNTHETIC_LAYOUT, write_synthetic_benchmarks
    from rewardkit.registry import load_reward
    from rewardkit.testing import random_images, save_tiny_checkpoint

    work = Path(tempfile.mkdtemp(prefix="rk-bench-overhead-"))
    write_synthetic_benchmarks(work / "data", n_pairs=args.pairs, n_groups=args.groups, image_size=args.image_size)
    reward = load_reward("clipscore", model=str(save_tiny_checkpoint("clip", work / "clip")), device="cpu",
                         convention="cosine")
    reward(random_images(2, size=args.image_size), "warm up")  # first-call initialisation is not harness time

    # time inside _score (the model alone) as well as inside __call__ (decoding + model)
    inner = reward._score
    model_s = [0.0]

    def timed(batch):
        t0 = time.perf_counter()
        try:
            return inner(batch)
        finally:
            model_s[0] += time.perf_counter() - t0

    reward._score = timed
    benches = ",".join(SYNTHETIC_LAYOUT)
    runs = []
    for i in range(args.repeats):
        model_s[0] = 0.0
        res = evaluate(reward, benches, data_dir=work / "data", cache_dir=work / f"cache{i}", ignore_sources=True,
                       n_boot=args.bootstrap, progress=False)
        t = dict(res.timing)
        t["model_s"] = model_s[0]
        t["load_s"] = sum(b.timing.get("load_s", 0.0) for b in res.benchmarks.values())
        t["wait_s"] = sum(b.timing.get("load_wait_s", 0.0) for b in res.benchmarks.values())
        t["metrics_s"] = sum(b.timing.get("metrics_s", 0.0) for b in res.benchmarks.values())
        runs.append(t)
    t0 = time.perf_counter()
    warm = evaluate(reward, benches, data_dir=work / "data", cache_dir=work / "cache0", ignore_sources=True,
                    n_boot=args.bootstrap, progress=False)
    warm_s = time.perf_counter() - t0
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    n_cmp = sum(b.counts["n_comparisons"] for b in warm.benchmarks.values())
    n_samples = sum(b.counts["n_unique_samples"] for b in warm.benchmarks.values())
    share = med["harness_s"] / med["total_s"]
    print(f"fixtures: 7 subsets, {n_cmp} comparisons, {n_samples} unique (image, prompt) samples, "
          f"{args.image_size}px PNGs; tiny CLIP on CPU; bootstrap {args.bootstrap}; median of {args.repeats} cold runs")
    print(f"total            {med['total_s']:8.3f} s")
    print(f"  reward         {med['reward_s']:8.3f} s  ({100 * med['reward_s'] / med['total_s']:5.1f}%)  "
          f"of which model forward (_score) {med['model_s']:.3f} s, input decoding {med['reward_s'] - med['model_s']:.3f} s")
    print(f"  harness        {med['harness_s']:8.3f} s  ({100 * share:5.1f}%)  "
          f"of which waiting for data {med['wait_s']:.3f} s, metrics + CIs {med['metrics_s']:.3f} s, "
          f"other (keys, cache, records) {med['harness_s'] - med['wait_s'] - med['metrics_s']:.3f} s")
    print(f"  (data loading + hashing took {med['load_s']:.3f} s in all, mostly in a background thread that "
          "overlaps scoring)")
    print(f"warm re-run (all cached): {warm_s:.3f} s, reward time {warm.timing['reward_s']:.3f} s")
    print(f"harness overhead {100 * share:.1f}% of total: {'PASS' if share < 0.10 else 'FAIL'} (target < 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
