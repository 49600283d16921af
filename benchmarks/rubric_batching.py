"""Faithfulness checklist scoring: level-batched rewardkit path vs one judge call per (image, question).

    python benchmarks/rubric_batching.py [--images 8] [--hidden 256] [--layers 4]

Both paths run the same transformers judge (a randomly initialised Qwen2.5-VL of the given size) on the same
B images x Q questions (a 3-level tree, every question asked: threshold ~0), side by side in one process.
Prints wall time, images through the vision tower and the largest P(yes) difference between the paths.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import torch

    from rewardkit import load_reward
    from rewardkit.compose.rubric import RubricCache, yes_no_conversation
    from rewardkit.judges import load_judge
    from rewardkit.testing import random_images, tiny_qwen2_5_vl

    torch.set_num_threads(2)
    model, proc = tiny_qwen2_5_vl(hidden_size=args.hidden, num_layers=args.layers)
    judge = load_judge((model, proc))
    tree = [{"id": 1, "question": "Is there a red apple in the image?", "parents": []},
            {"id": 2, "question": "Is the apple on a wooden table?", "parents": [1]},
            {"id": 3, "question": "Is the apple shiny?", "parents": [1]},
            {"id": 4, "question": "Is there a table?", "parents": []},
            {"id": 5, "question": "Is the table wooden?", "parents": [4]},
            {"id": 6, "question": "Is the wooden table brown?", "parents": [5]}]
    prompt = "a shiny red apple on a brown wooden table"
    images = random_images(args.images, sizes=[(56, 56), (48, 56), (56, 40)], seed=1)
    with tempfile.TemporaryDirectory() as d:
        cache = RubricCache(f"{d}/q.jsonl")
        cache.put(prompt, questions=tree)
        reward = load_reward("faithfulness", judge=judge, questions=str(cache.path), threshold=1e-6)
        fmt, system = reward.template["answer_prompt"], reward.template["answer_system"]

        def naive():
            out = []
            for im in images:
                out.append({str(q["id"]): float(judge.choice_probs(
                    [yes_no_conversation([im], fmt.format(question=q["question"]), system)], ["Yes", "No"])[0, 0])
                    for q in tree})
            return out

        def batched():
            return [d_["p_yes"] for d_ in reward(images, prompt).details]

        results = {}
        for name, fn in (("naive (one call per question)", naive), ("rewardkit (one call per tree level)", batched)):
            fn()  # warm-up
            enc0 = judge.stats["images_encoded"]
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                probs = fn()
            wall = (time.perf_counter() - t0) / args.repeats
            results[name] = {"wall_s": round(wall, 3),
                             "images_encoded": (judge.stats["images_encoded"] - enc0) // args.repeats,
                             "probs": probs}
    names = list(results)
    diff = max(abs(results[names[0]]["probs"][i][q] - results[names[1]]["probs"][i][q])
               for i in range(len(images)) for q in results[names[0]]["probs"][i])
    print(f"Qwen2.5-VL random init, hidden {args.hidden}, {args.layers} layers; {len(images)} images x {len(tree)} "
          f"questions (3 levels), CPU, torch threads 2")
    print(f"{'method':40s} {'wall s':>8s} {'images through vision':>22s}")
    for name in names:
        r = results[name]
        print(f"{name:40s} {r['wall_s']:8.3f} {r['images_encoded']:22d}")
    print(f"speed-up: {results[names[0]]['wall_s'] / results[names[1]]['wall_s']:.2f}x; "
          f"max |P(yes) difference|: {diff:.2e}")
    print(json.dumps({n: {k: v for k, v in r.items() if k != "probs"} for n, r in results.items()}))


if __name__ == "__main__":
    main()
