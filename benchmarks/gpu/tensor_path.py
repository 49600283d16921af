"""GPU run of the tensor-path benchmark: ``python benchmarks/gpu/tensor_path.py`` (no arguments needed).

Runs ``benchmarks/tensor_path.py`` on ``cuda`` with a ViT-L/14-size random CLIP (flow_grpo's CLIP reward
geometry) and the tiny Qwen2.5-VL preference model at Qwen2.5-VL's default pixel budget, in bf16, 32 images of
512² already on the GPU. Prints one JSON object per configuration. Needs nothing from the network; finishes in
well under 5 minutes on one GPU (a watchdog stops it at 280 s, printing what it has).

What to read: ``ratio`` (tensor path vs processor path, input + model) and ``input_ratio`` (input path alone);
``max_abs_score_diff`` is the agreement of the two paths.
"""

from __future__ import annotations

import faulthandler
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tensor_path  # noqa: E402  (benchmarks/tensor_path.py)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: run benchmarks/tensor_path.py for the CPU figures")
        return 1
    faulthandler.dump_traceback_later(280, exit=True)
    t0 = time.time()
    for argv in (["--device", "cuda", "--clip", "large", "--dtype", "bfloat16", "--repeats", "5", "--threads", "0"],
                 ["--device", "cuda", "--clip", "large", "--dtype", "float32", "--repeats", "5", "--threads", "0",
                  "--skip-preference"]):
        print("# args:", " ".join(argv), flush=True)
        tensor_path.main(argv)
        print(f"# elapsed {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
