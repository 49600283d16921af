"""GPU run of the reward-server benchmark: ``python benchmarks/gpu/serve_batching.py`` (no arguments needed).

Runs ``benchmarks/serve_batching.py`` with the server's model on ``cuda``: a random CLIP at 224 px (no
download), 16 concurrent single-image clients of 512² images, dynamic batching vs ``--max-batch 1``, 2 rounds.
Prints the requests/s of each and the ratio. Finishes in well under 5 minutes on one GPU (each server run is
bounded; a watchdog stops the script at 280 s, printing what it has).

``--dry-run`` runs the same code on the CPU at toy sizes (tested in CI, so the GPU run has no surprises).
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
    faulthandler.dump_traceback_later(280, exit=True)
    if dry:
        args = ["--clients", "4", "--requests", "3", "--rounds", "1", "--size", "64"]
    else:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: use --dry-run on a CPU machine")
            return 2
        args = ["--clients", "16", "--requests", "20", "--rounds", "2", "--size", "512", "--device", "cuda:0",
                "--image-size", "224"]
    t0 = time.time()
    res = subprocess.run([sys.executable, str(HERE / "serve_batching.py"), *args], timeout=270)
    print(f"serve_batching {'dry run' if dry else 'GPU run'} finished in {time.time() - t0:.0f} s "
          f"(exit {res.returncode})")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
