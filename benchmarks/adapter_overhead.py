"""Per-call overhead of each trainer adapter (``rewardkit.integrations``) against a direct reward call.

The tiny CLIP reward (PickScore architecture) scores 32 images of 256x256 given as the host gives them
(float NCHW in [0, 1] for flow_grpo / DDPO, PIL images for TRL, uint8 CHW tensors one per call for verl).
An adapter hands the reward exactly the inputs a direct call gets, so its overhead is the time it spends
*outside* the reward's ``__call__`` (argument handling, NaN policy, conversion of the result): measured
per call as ``adapter wall time - time inside reward.__call__`` and reported as a fraction of the median
direct ``reward(...)`` call. This is robust to a loaded machine, where two wall-clock medians of ~1 s CPU
calls differ by tens of percent from noise alone; the side-by-side wall-clock ratio is printed too.
Target: under 2% of the direct call.

    python benchmarks/adapter_overhead.py [--n 32] [--size 256] [--repeats 15] [--threads 1]
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
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: on a shared, oversubscribed CPU, OpenMP thread "
                         "pools make single-call times vary 5x; one thread keeps them within ~10%%)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)

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
        from rewardkit.media import to_pil

        pil = [to_pil(x) for x in imgs]
        u8 = (imgs * 255).round().to(torch.uint8)

        inside: list[float] = []
        base_call = type(reward).__call__

        class Timed(type(reward)):     # records the time spent inside the reward's own __call__
            def __call__(self, *a, **k):
                t0 = time.perf_counter()
                try:
                    return base_call(self, *a, **k)
                finally:
                    inside.append(time.perf_counter() - t0)

        reward.__class__ = Timed
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
        print("| adapter | direct call (median) | adapter call (median) | time outside the reward (median) | "
              "overhead vs direct |")
        print("|---|---|---|---|---|")
        for name, (adapter, direct) in cases.items():
            ta, td, outside = [], [], []
            for r in range(args.repeats):
                if r % 2:   # alternate the order so drifts in machine load hit both sides
                    td.append(_timed(direct))
                inside.clear()
                t = _timed(adapter)
                ta.append(t)
                outside.append(t - sum(inside))
                if not r % 2:
                    td.append(_timed(direct))
            md, ma, mo = statistics.median(td), statistics.median(ta), statistics.median(outside)
            print(f"| {name} | {md * 1e3:.1f} ms | {ma * 1e3:.1f} ms | {mo * 1e3:.3f} ms | "
                  f"**{mo / md * 100:.3f}%** (wall-clock ratio {(ma / md - 1) * 100:+.1f}%) |")
        # verl-omni calls compute_score per sample from many threads: micro-batching turns 32 concurrent
        # single-image calls into batched reward calls.
        from concurrent.futures import ThreadPoolExecutor

        batched = verl_compute_score(reward, micro_batch=n, max_wait_s=0.05)

        def threaded(fn):
            with ThreadPoolExecutor(max_workers=n) as ex:
                futs = [ex.submit(fn, data_source="x", solution_image=u8[i], ground_truth=prompts[i], extra_info={})
                        for i in range(n)]
                return [f.result()["score"] for f in futs]

        threaded(batched), threaded(verl)
        tb, tp, calls = [], [], []
        for r in range(max(3, args.repeats // 3)):
            inside.clear()
            tb.append(_timed(lambda: threaded(batched)))
            calls.append(len(inside))
            tp.append(_timed(lambda: threaded(verl)))
        mb, mp = statistics.median(tb), statistics.median(tp)
        print(f"\nverl, {n} concurrent per-sample calls from {n} threads: per-sample {mp * 1e3:.0f} ms, "
              f"micro_batch={n} {mb * 1e3:.0f} ms ({statistics.median(calls):.0f} reward calls instead of {n}): "
              f"**{mp / mb:.1f}x**")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
