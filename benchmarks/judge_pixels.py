"""VQAScore on the tiny Qwen-VL judge: the image processor (old path) vs the batched exact pixels (new path).

    python benchmarks/judge_pixels.py                    # tiny Qwen2.5-VL, batch 1 and 8, mixed sizes
    python benchmarks/judge_pixels.py --model qwen3_vl --rounds 40 --threads 1

One ``TransformersJudge`` serves both paths: ``judge.pixels.fast = False`` runs transformers'
``Qwen2VLImageProcessorPil`` on every call (what the judge did before issue 41), ``True`` builds the same
``pixel_values`` with :func:`rewardkit.models.pil_pixel_values` (checked against the processor on a first call).
Each round calls ``reward(images, prompts)`` once per path, the order alternating from round to round (both see
the same machine load); every call is a new judge session, so each image goes through the vision tower in every
call. Inputs: random RGB images of generator-like sizes (256-768 px per side; ``--sizes equal``: all 512x512),
resized by the tiny processor to at most 56x56 (``--max-pixels``: a larger bound, more image tokens per image).

Prints, per batch size: the median per-call wall and process CPU time of each path, their ratio (old / new), the
median time of the pixel step alone for that batch (processor vs batched) and its share of an old call, and
checks that both paths give the same scores (``torch.equal``). For a batch over 1 it also gives the CPU time per
image of the batch against the same images one call each (new path, interleaved; issue 41 item 2: batching
must not cost more per image), and of the batch with its prefixes prefilled in one padded forward
(``judge.group_prefill = False``, the judge before item 2) instead of one forward per prefix length. The load average is printed at the start and end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rewardkit.judges.transformers_backend import TransformersJudge  # noqa: E402
from rewardkit.rewards.vqascore import VQAScore  # noqa: E402
from rewardkit.testing import random_images, tiny_qwen2_5_vl, tiny_qwen3_vl  # noqa: E402

SIZES = {"tiny": dict(hidden_size=32, num_layers=1), "small": dict(hidden_size=256, num_layers=4)}
MIXED = [(512, 512), (384, 640), (640, 384), (448, 448), (256, 256), (512, 768), (768, 512), (320, 480)]


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["qwen2_5_vl", "qwen3_vl"], default="qwen2_5_vl")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny", help="language model size (small: hidden 256, 4 layers)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--sizes", choices=["mixed", "equal"], default="mixed")
    ap.add_argument("--one-by-one", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the batch's images one call each (CPU per image; issue 41 item 2)")
    ap.add_argument("--max-pixels", type=int, default=0,
                    help="the processor's max_pixels (0: the tiny processor's own, 4 merged tokens per image at most)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, proc = (tiny_qwen2_5_vl if args.model == "qwen2_5_vl" else tiny_qwen3_vl)(**SIZES[args.size])
    if args.max_pixels:
        proc.image_processor.size["longest_edge"] = int(args.max_pixels)
    judge = TransformersJudge(model, proc)
    reward = VQAScore(judge=judge)
    print(f"judge_pixels: {args.size} {args.model}, sizes {args.sizes}, max_pixels {proc.image_processor.size['longest_edge']}, {args.rounds} interleaved rounds, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    print(f"{'batch':>5} | {'old ms/call':>11} | {'new ms/call':>11} | {'wall ratio':>10} | {'old CPU ms':>10} | "
          f"{'new CPU ms':>10} | {'CPU ratio':>9} | {'pixels old / new ms':>19} | {'pixels CPU old / new':>20} | "
          f"{'pixel share of old CPU':>22} | same")
    for b in args.batches:
        sizes = MIXED if args.sizes == "mixed" else [(512, 512)]
        images = random_images(b, sizes=[sizes[i % len(sizes)] for i in range(b)], seed=b)
        prompts = [f"a photo of object number {i}" for i in range(b)]
        judge.pixels.fast = None
        reward(images, prompts)  # warm-up; the new path's first batch is checked against the processor
        assert judge.pixels.fast is True, "the batched pixels did not reproduce the processor"
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        scores: dict[bool, torch.Tensor] = {}
        for r in range(args.rounds):
            for fast in ((False, True) if r % 2 == 0 else (True, False)):
                judge.pixels.fast = fast
                out, w, c = _timed(lambda: reward(images, prompts))
                times[fast].append((w, c))
                scores[fast] = out.scores
        judge.pixels.fast = True
        # item 2: the same images one call each (new path), against the batch of b (new path), interleaved
        per_image: dict[str, list[float]] = {"batch": [], "padded": [], "one": []}
        if b > 1 and args.one_by_one:
            ways = ("batch", "padded", "one")
            for r in range(args.rounds):
                for way in ways[r % 3:] + ways[:r % 3]:  # each way first, second and last in turn
                    judge.group_prefill = way != "padded"
                    if way == "one":
                        per_image[way].append(sum(_timed(lambda i=i: reward(images[i:i + 1], prompts[i:i + 1]))[2]
                                                  for i in range(b)) / b)
                    else:
                        per_image[way].append(_timed(lambda: reward(images, prompts))[2] / b)
            judge.group_prefill = True
        # the pixel step alone, on the canonical images the judge sees
        from rewardkit.media import _to_pil

        canon = [_to_pil(im) for im in images]
        pix = {False: [], True: []}
        for r in range(args.rounds):
            for fast in ((False, True) if r % 2 == 0 else (True, False)):
                fn = (lambda: judge.pixels(canon)) if fast else (lambda: judge.pixels.processor(canon))
                pix[fast].append(_timed(fn)[1:])
        med = {k: (statistics.median(x[0] for x in v) * 1e3, statistics.median(x[1] for x in v) * 1e3)
               for k, v in times.items()}
        pmed = {k: statistics.median(x[0] for x in v) * 1e3 for k, v in pix.items()}
        pcpu = {k: statistics.median(x[1] for x in v) * 1e3 for k, v in pix.items()}
        same = torch.equal(scores[False], scores[True])
        print(f"{b:>5} | {med[False][0]:>11.2f} | {med[True][0]:>11.2f} | {med[False][0] / med[True][0]:>9.2f}x | "
              f"{med[False][1]:>10.2f} | {med[True][1]:>10.2f} | {med[False][1] / med[True][1]:>8.2f}x | "
              f"{pmed[False]:>8.2f} / {pmed[True]:>6.2f} | {pcpu[False]:>9.2f} / {pcpu[True]:>6.2f} | "
              f"{pcpu[False] / med[False][1]:>22.0%} | {same}")
        if per_image["batch"]:
            pb, pp, po = (statistics.median(per_image[k]) * 1e3 for k in ("batch", "padded", "one"))
            print(f"      CPU ms per image (new pixels): batch of {b} {pb:.2f} (prefill in one padded forward: "
                  f"{pp:.2f}), one by one {po:.2f}; batch vs one by one {po / pb:.2f}x (padded: {po / pp:.2f}x)")
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
