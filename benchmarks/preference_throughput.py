"""Preference reward throughput on the tiny Qwen2.5-VL: batched vs one-by-one scoring, and training pairs/s.

    python benchmarks/preference_throughput.py [--images 64] [--batch-size 16] [--repeats 7] [--threads 1]

Prints one JSON object. Batched and one-by-one runs are interleaved (same process, same images), ``--warmup``
rounds (3) are discarded (both sides speed up over a process's first rounds, the batched side more: 24 -> 18-19
ms and 120 -> ~110 ms per round over the first six on the 2-core machine; their ratios are printed apart) and
the median of ``--repeats`` rounds is reported, with each round's ratio, their median
and the machine's load average (a loaded machine slows the one-by-one loop more and flatters the ratio).
``--threads 1`` (default) pins torch to one intra-op thread: on a shared machine, spinning OpenMP threads make
timings swing by 5x. ``--profile`` adds where the time of one call goes, stage by stage, for one image and for
a batch (CPU time of this thread, lower quartile of 40 calls, so other processes on the machine count less;
measured after the rounds, which it does not change). Targets: batched >= 6x the one-by-one loop at batch 16 (issue 28; was 4x); one backbone
forward per training micro-batch (chosen and rejected together).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3,
                    help="uncounted rounds first (both sides speed up over the first rounds of a process)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave torch's default)")
    ap.add_argument("--size", type=int, default=56, help="image side in pixels")
    ap.add_argument("--train-steps", type=int, default=12)
    ap.add_argument("--profile", action="store_true", help="add a per-stage breakdown of one call (see above)")
    ap.add_argument("--patch-embed", default="linear", choices=("linear", "conv"),
                    help="the vision patch embedding: one matrix product (default) or the stock Conv3d")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from rewardkit import load_reward
    from rewardkit.models.preference import PreferenceModel, _inner_model
    from rewardkit.testing import random_images
    from rewardkit.train.trainer import PreferenceTrainConfig, PreferenceTrainer

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="rk-pref-bench-"))
    PreferenceModel.from_backbone("tiny:qwen2_5_vl").save_pretrained(tmp / "model")
    reward = load_reward("preference", model=str(tmp / "model"), device="cpu", patch_embed=args.patch_embed)
    images = random_images(args.images, size=args.size)
    prompt = "a photo of a cat sitting on a mat"
    reward(images[:4], prompt, batch_size=4)  # warm-up

    load_before = os.getloadavg()
    batched_t, single_t, warmup_ratios = [], [], []
    for rnd in range(args.warmup + args.repeats):
        t0 = time.perf_counter()
        out_b = reward(images, prompt, batch_size=args.batch_size)
        batched_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out_s = [reward([im], prompt).scores for im in images]
        single_t.append(time.perf_counter() - t0)
        if rnd < args.warmup:  # warm-up rounds: reported, not counted
            warmup_ratios.append(single_t.pop() / batched_t.pop())
    load_after = os.getloadavg()
    round_ratios = [s / b for b, s in zip(batched_t, single_t)]
    max_diff = float((out_b.scores - torch.cat(out_s)).abs().max())
    b_ips = args.images / statistics.median(batched_t)
    s_ips = args.images / statistics.median(single_t)

    profile = stage_profile(reward, images[:args.batch_size], prompt) if args.profile else None

    # training: the tiny recipe (12 steps of 8 pairs); count backbone forwards per micro-batch, measure pairs/s,
    # wall time and held-out accuracy
    from rewardkit.config import load_config

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "arena_rm" / "tiny.yaml"
    cfg = load_config(PreferenceTrainConfig, recipe, [f"output_dir={tmp / 'train'}", "progress=false",
                                                      f"max_steps={args.train_steps}", "log_every=1",
                                                      "data.synthetic_size=128"])
    t0 = time.perf_counter()
    trainer = PreferenceTrainer(cfg)
    calls = []
    hook = _inner_model(trainer.model_raw.vlm).register_forward_hook(lambda *a: calls.append(1))
    summary = trainer.train()
    train_wall = time.perf_counter() - t0  # model build, data, training, eval, checkpoint and model save
    hook.remove()
    eval_forwards = -(-summary["eval_pairs"] // cfg.eval_batch_size)
    rows = [json.loads(x) for x in (tmp / "train" / "metrics.jsonl").read_text().splitlines()]
    step_pps = [r["pairs_per_s"] for r in rows if r.get("split") == "train" and r.get("step", 0) > 1]
    micro_batches = args.train_steps * cfg.global_batch_size // cfg.micro_batch_size

    print(json.dumps({
        "model": "tiny Qwen2.5-VL (hidden 32, 1 layer) + linear head",
        "torch_threads": torch.get_num_threads(), "patch_embed": args.patch_embed,
        "images": args.images, "image_size": args.size, "batch_size": args.batch_size, "repeats": args.repeats,
        "batched_images_per_s": round(b_ips, 1),
        "one_by_one_images_per_s": round(s_ips, 1),
        "batched_over_one_by_one": round(b_ips / s_ips, 2),
        "round_ratios": [round(r, 2) for r in round_ratios],
        "warmup_round_ratios": [round(r, 2) for r in warmup_ratios],
        "median_round_ratio": round(statistics.median(round_ratios), 2),
        "load_average_1_5_15_before": [round(x, 2) for x in load_before],
        "load_average_1_5_15_after": [round(x, 2) for x in load_after],
        "batched_vs_one_by_one_max_abs_diff": max_diff,
        "train_pairs_per_s_median_step": round(statistics.median(step_pps), 1) if step_pps else None,
        "train_steps": args.train_steps, "train_global_batch": cfg.global_batch_size,
        "backbone_forwards_per_micro_batch": (len(calls) - eval_forwards) / micro_batches,
        "tiny_recipe_eval_accuracy": summary["eval_accuracy"],
        "tiny_recipe_wall_s": round(train_wall, 1),
        **({"profile_ms_per_call": profile} if profile else {}),
    }, indent=1))
    return 0


def stage_profile(reward, images, prompt, reps: int = 40) -> dict:
    """Thread CPU ms (lower quartile of ``reps``) of each stage of a call for 1 image and for ``len(images)``, and the cost each
    further image adds (``(batched - one) / (n - 1)``): what batching can amortise is the difference."""
    from rewardkit.models.pil_pixels import pil_pixel_values
    from rewardkit.models.preference import _base, _inner_model
    from rewardkit.models.rope import batch_position_ids, vision_layout_kwargs

    m = reward.model
    inner, base = _inner_model(m.vlm), _base(m.vlm)
    enc_obj = m._input_encoder()

    def stages(ims):
        n = len(ims)
        dec = [reward._decode_sample(x, None)[0] for x in ims]
        enc = m.encode(dec, [prompt] * n)
        layout = {k: v for k, v in vision_layout_kwargs(base, enc).items()}
        pos = batch_position_ids(base.config, enc["input_ids"], enc["attention_mask"], enc)
        rest = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
        texts = [enc_obj.render(prompt, 0)] * n
        counts = [int(c) for c in (enc["image_grid_thw"].prod(-1) // 4)]
        return {
            "whole call": lambda: reward(ims, prompt, batch_size=n),
            "input checks + decoding": lambda: [(reward._precheck(prompt, x, None), reward._decode_sample(x, None))
                                                for x in ims],
            "encode (pixels + token rows)": lambda: m.encode(dec, [prompt] * n),
            "pixel values": lambda: pil_pixel_values(dec, m.processor.image_processor),
            "token rows": lambda: enc_obj._expand_ids(texts, counts),
            "3-D positions": lambda: batch_position_ids(base.config, enc["input_ids"], enc["attention_mask"], enc),
            "model forward (positions, backbone, head)": lambda: m(**enc),
            "backbone (vision + language)": lambda: inner(input_ids=enc["input_ids"],
                                                          attention_mask=enc["attention_mask"], use_cache=False,
                                                          position_ids=pos, **rest, **layout),
            "vision tower": lambda: inner.get_image_features(
                pixel_values=enc["pixel_values"], image_grid_thw=enc["image_grid_thw"],
                **{k: v for k, v in layout.items() if k != "image_grid_thw"}),
        }

    one, many = stages(images[:1]), stages(images)
    times = {k: ([], []) for k in one}
    with torch.inference_mode():
        for _ in range(reps):
            for fs, side in ((one, 0), (many, 1)):
                for k, f in fs.items():
                    t0 = time.thread_time()
                    f()
                    times[k][side].append(time.thread_time() - t0)
    n = len(images)
    out = {}
    for k, (a, b) in times.items():
        a, b = 1000 * _lower_quartile(a), 1000 * _lower_quartile(b)
        out[k] = {"one_image": round(a, 3), f"batch_of_{n}": round(b, 3),
                  "each_further_image": round((b - a) / max(n - 1, 1), 4)}
    return out


def _lower_quartile(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 4]


if __name__ == "__main__":
    sys.exit(main())
