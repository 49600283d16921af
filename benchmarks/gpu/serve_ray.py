"""GPU run of the Ray Serve benchmark: ``python benchmarks/gpu/serve_ray.py`` (no arguments needed).

Runs ``benchmarks/serve_ray.py`` with the model on the GPU: a random CLIP at 224 px (no download), 8 concurrent
single-image clients of 512² images; ``rewardkit serve`` on ``cuda`` vs the Ray Serve deployment with 1 replica
(the whole GPU) and 2 replicas (half a GPU each). Prints the requests/s of each and the ratios. A watchdog stops
the script at 280 s, printing what it has.

``--dry-run`` runs the same code on the CPU at toy sizes (tested in CI, so the GPU run has no surprises). Other
arguments go on to ``benchmarks/serve_ray.py`` (the tests pass ``--ray-address`` of their running cluster).
"""

from __future__ import annotations

import faulthandler
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def main() -> int:
    dry = "--dry-run" in sys.argv[1:]
    extra = [a for a in sys.argv[1:] if a != "--dry-run"]
    faulthandler.dump_traceback_later(280, exit=True)
    if dry:
        args = ["--dry-run", "--size", "32"]
    else:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: use --dry-run on a CPU machine")
            return 2
        args = ["--clients", "8", "--requests", "30", "--size", "512", "--device", "cuda:0", "--num-gpus", "1",
                "--num-cpus", "1", "--image-size", "224"]
    t0 = time.time()
    res = subprocess.run([sys.executable, str(HERE / "serve_ray.py"), *args, *extra], timeout=270)
    print(f"serve_ray {'dry run' if dry else 'GPU run'} finished in {time.time() - t0:.0f} s "
          f"(exit {res.returncode})")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
