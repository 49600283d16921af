"""Group win rates through a pairwise judge: ``GroupReward`` vs judging every ordered pair one request at a time.

    python benchmarks/group_reward.py                    # G = 8, 16, 24; tiny Qwen2.5-VL; 3 rounds
    python benchmarks/group_reward.py --groups 8 --rounds 5 --max-new-tokens 8

Workload: one prompt, G random images, UnifiedReward's ``t2i`` pairwise prompt on the transformers judge
engine, images of 448x448 (``--size``; 256 image tokens each, the processor's pixel cap raised to that) (a tiny random Qwen2.5-VL built in-process by ``rewardkit.testing``: its answers never parse, so every
win rate is NaN; the cost of asking is what is measured). Both sides ask the judge the same G (G - 1)
conversations, greedily, with the same token budget:

- one-at-a-time: for every ordered pair (i, j), i != j, one ``compare([i], [j])`` request (a reward with
  ``both_orders=False``: one conversation per request), as a hand-written Pref-GRPO loop would;
- group: ``GroupReward(reward, mode="winrate")(images, prompt)``: the G (G - 1) / 2 unordered pairs in one
  ``compare`` call that asks each in both orders (the reward's ``both_orders=True``), in one judge session: each
  image through the vision tower once, each shared prefix (template + first image) prefilled once.

Rounds run both back to back (interleaved, so both see the same machine load) after one untimed warm-up of each;
printed per G: judge ``generate`` calls, prefill tokens (prompt tokens run through the language model), images
through the vision tower, wall time per round and the median ratio, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _counting(judge):
    calls = {"n": 0}
    real = judge.generate

    def generate(*a, **kw):
        calls["n"] += 1
        return real(*a, **kw)

    judge.generate = generate
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="8,16,24")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", type=int, default=448, help="image side (448: 256 image tokens after the 2x2 merge)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from rewardkit import GroupReward
    from rewardkit.judges.transformers_backend import TransformersJudge
    from rewardkit.rewards.unifiedreward import UnifiedReward
    from rewardkit.testing import random_images, save_tiny_checkpoint

    tmp = tempfile.mkdtemp()
    path = save_tiny_checkpoint("qwen2_5_vl", Path(tmp) / "judge")
    # the tiny checkpoint's processor caps an image at 3136 pixels (4 tokens); a real Qwen2.5-VL keeps a 448x448
    # image whole (256 tokens): raise the cap to the benchmark's image size, as the real processor would have it
    import json

    cfg_file = path / "preprocessor_config.json"
    pp = json.loads(cfg_file.read_text())
    pp["size"] = {"longest_edge": max(args.size * args.size, 3136), "shortest_edge": 784}
    cfg_file.write_text(json.dumps(pp))
    judge = TransformersJudge(str(path), device="cpu")
    kw = dict(judge=judge, template="t2i", max_new_tokens=args.max_new_tokens, on_judge_error="nan")
    one_order = UnifiedReward(both_orders=False, batch_size=1, **kw)
    grouped = GroupReward(UnifiedReward(both_orders=False, batch_size=4096, **kw), mode="winrate")  # it swaps
    calls = _counting(judge)
    print(f"torch threads {torch.get_num_threads()}, max_new_tokens {args.max_new_tokens}, rounds {args.rounds}, "
          f"images {args.size}x{args.size}")
    print("G | judge calls (one-at-a-time / group) | prefill tokens | images encoded | wall s per round "
          "(one / group) | median ratio | load")
    prompt = "a red cube on a blue sphere"
    for G in [int(g) for g in args.groups.split(",")]:
        images = random_images(G, size=args.size, seed=G)

        def run_one():
            for i in range(G):
                for j in range(G):
                    if i != j:
                        one_order.compare([images[i]], [images[j]], prompt, on_error="nan")

        def run_group():
            return grouped(images, prompt, on_error="nan")

        figures = {}
        for name, fn in (("one", run_one), ("group", run_group)):   # warm-up + counters
            before_calls, before = calls["n"], dict(judge.stats)
            fn()
            figures[name] = (calls["n"] - before_calls,
                             judge.stats["prefill_tokens"] - before.get("prefill_tokens", 0),
                             judge.stats["images_encoded"] - before.get("images_encoded", 0))
        walls: dict[str, list[float]] = {"one": [], "group": []}
        for _ in range(args.rounds):
            for name, fn in (("one", run_one), ("group", run_group)):
                t = time.perf_counter()
                fn()
                walls[name].append(time.perf_counter() - t)
        ratios = [a / b for a, b in zip(walls["one"], walls["group"])]
        (c1, p1, i1), (c2, p2, i2) = figures["one"], figures["group"]
        print(f"{G} | {c1} / {c2} ({c1 / c2:.0f}x) | {p1} / {p2} ({p1 / p2:.2f}x) | {i1} / {i2} | "
              f"{', '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(walls['one'], walls['group']))} | "
              f"{statistics.median(ratios):.2f}x | {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
