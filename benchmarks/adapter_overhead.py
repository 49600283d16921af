"""Per-call overhead of each trainer adapter (``rewardkit.integrations``) against a direct reward call.

The tiny CLIP reward (PickScore architecture) scores 32 images of 256x256 given as the host gives them
(float NCHW in [0, 1] for flow_grpo / DDPO, PIL images for TRL, uint8 CHW tensors one per call for verl).
Each adapter call and the matching direct ``reward(...)`` call are timed alternately (side by side, same
inputs), ``--repeats`` times; the reported overhead is ``median(adapter) / median(direct) - 1``.
Target: under 2% of the direct call.

    python benchmarks/adapter_overhead.py [--n 32] [--size 256] [--repeats 15]
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


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="images per call (default 32)")
    ap.add_argument("--size", type=int, default=256, help="image side (default 256)")
    ap.add_argument("--repeats", type=int, default=15, help="timed pairs per adapter (median reported)")
    args = ap.parse_args()

    import torch

    from rewardkit.integrations import (ddpo_reward_fn, flow_grpo_scorer, multi_score, trl_reward_func,
                                        verl_compute_score)
    from rewardkit.registry import load_reward
    from rewardkit.testing import save_tiny_checkpoint

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        reward = load_reward("pickscore", model=str(save_tiny_checkpoint("clip", Path(tmp) / "clip")), device="cpu")
        n = args.n
        imgs = torch.rand(n, 3, args.size, args.size)
        prompts = tuple(f"a photo of object number {i}" for i in range(n))
        metas = tuple({} for _ in range(n))
        pil = [__import__("rewardkit").media.to_pil(x) for x in imgs]
        u8 = (imgs * 255).round().to(torch.uint8)

        fg = flow_grpo_scorer(reward)
        ms = multi_score("cpu", {"pickscore": 1.0}, rewards={"pickscore": reward})
        trl = trl_reward_func(reward)
        ddpo = ddpo_reward_fn(reward)
        verl = verl_compute_score(reward)
        cases = {
            "flow_grpo_scorer (float NCHW)": (lambda: fg(imgs, prompts, metas), lambda: reward(imgs, list(prompts))),
            "multi_score (float NCHW)": (lambda: ms(imgs, prompts, metas, only_strict=True),
                                         lambda: reward(imgs, list(prompts))),
            "TRL reward function (PIL column)": (
                lambda: trl(prompts=["d"] * n, completions=list(prompts), completion_ids=[[0]] * n,
                            trainer_state=None, log_extra=None, log_metric=None, image=pil),
                lambda: reward(pil, list(prompts))),
            "DDPO reward_fn (float NCHW)": (lambda: ddpo(imgs, prompts, metas), lambda: reward(imgs, list(prompts))),
            "verl compute_score (uint8 CHW, per sample)": (
                lambda: [verl(data_source="x", solution_image=u8[i], ground_truth=prompts[i], extra_info={})
                         for i in range(n)],
                lambda: [reward(u8[i], prompts[i]) for i in range(n)]),
        }
        for adapter, direct in cases.values():   # warm-up (first-call costs: loading, caches)
            adapter(), direct()
        print(f"{n} images of {args.size}x{args.size}, tiny CLIP on CPU, {args.repeats} timed pairs each "
              f"(torch threads: {torch.get_num_threads()})\n")
        print("| adapter | direct call (median) | adapter call (median) | overhead |")
        print("|---|---|---|---|")
        for name, (adapter, direct) in cases.items():
            ta, td = [], []
            for r in range(args.repeats):
                if r % 2:   # alternate the order so drifts in machine load hit both sides
                    td.append(_timed(direct)), ta.append(_timed(adapter))
                else:
                    ta.append(_timed(adapter)), td.append(_timed(direct))
            md, ma = statistics.median(td), statistics.median(ta)
            print(f"| {name} | {md * 1e3:.1f} ms | {ma * 1e3:.1f} ms | **{(ma / md - 1) * 100:+.2f}%** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
