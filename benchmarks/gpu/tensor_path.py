"""GPU run of the tensor-path benchmark: ``python benchmarks/gpu/tensor_path.py`` (no arguments needed).

Runs ``benchmarks/tensor_path.py`` on ``cuda`` with a ViT-L/14-size random CLIP (flow_grpo's CLIP reward
geometry) and the tiny Qwen2.5-VL preference model at Qwen2.5-VL's default pixel budget, in bf16, 32 images of
512² already on the GPU. Prints one JSON object per configuration. Needs nothing from the network; finishes in
well under 5 minutes on one GPU (a watchdog stops it at 280 s, printing what it has).

``--dry-run`` runs the same code on the CPU at toy sizes (CI runs it, so the GPU run has no surprises).

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


CONFIGS = (
    ["--device", "cuda", "--clip", "large", "--dtype", "bfloat16", "--repeats", "5", "--threads", "0"],
    ["--device", "cuda", "--clip", "large", "--dtype", "float32", "--repeats", "5", "--threads", "0",
     "--skip-preference"],
)
DRY_RUN = (["--device", "cpu", "--clip", "small", "--dtype", "bfloat16", "--images", "2", "--side", "64",
            "--repeats", "1", "--threads", "0"],)


def main(argv: list[str] | None = None) -> int:
    dry = "--dry-run" in (sys.argv[1:] if argv is None else argv)
    if not dry and not torch.cuda.is_available():
        print("no CUDA device: run benchmarks/tensor_path.py for the CPU figures (or --dry-run)")
        return 1
    if not dry:  # the watchdog: a GPU run never exceeds its 5-minute slot
        faulthandler.dump_traceback_later(280, exit=True)
    t0 = time.time()
    try:
        for args in (DRY_RUN if dry else CONFIGS):
            print("# args:", " ".join(args), flush=True)
            tensor_path.main(list(args))
            print(f"# elapsed {time.time() - t0:.1f} s", flush=True)
    finally:
        if not dry:
            faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
