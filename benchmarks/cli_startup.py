"""How long `rewardkit ls` and `rewardkit --help` take from a cold process (target: `ls` under 1.5 s).

Side by side, interleaved rounds: `rewardkit ls --json` (metadata table, no reward module imported) against the
same listing built by importing every built-in reward class (what `ls` did before 0.1's metadata table).

    python benchmarks/cli_startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "rewardkit ls --json": [sys.executable, "-m", "rewardkit.cli", "ls", "--json"],
    "rewardkit --help": [sys.executable, "-m", "rewardkit.cli", "--help"],
    "import every reward class": [sys.executable, "-c",
                                  "from rewardkit.commands.ls import builtin_metadata; builtin_metadata()"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(args.rounds):
        for name, cmd in CASES.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        print(f"{name:28s} median {statistics.median(ts):6.3f} s  (rounds: {', '.join(f'{t:.3f}' for t in ts)})")
    ratio = statistics.median(times["import every reward class"]) / statistics.median(times["rewardkit ls --json"])
    print(f"ls from the metadata table is {ratio:.1f}x faster than importing the classes")


if __name__ == "__main__":
    main()
