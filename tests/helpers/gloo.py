"""Two worker processes of one gloo process group, started directly (no torchrun agent): the environment torchrun
gives its workers (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), on the loopback
address, so ``rewardkit.distributed.init_from_env`` joins the group as under torchrun.

Why not ``torchrun --standalone``: its agent is a third Python process importing torch (seconds of CPU on a
2-core machine) and its c10d rendezvous has its own timeouts; on a loaded machine the whole launch once ran past
the test's 240 s. Here rank 0 hosts the store on a port picked free just before the start; if that port was
taken in between (the only race), the start is retried on another port. Each worker's output is kept, and a
worker that fails or hangs is reported with both workers' stderr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_gloo_workers(script: Path, env: dict[str, str], timeout: float = 600, cwd: Path | None = None,
                         tries: int = 3) -> list[subprocess.CompletedProcess]:
    """Run ``python script`` as ranks 0 and 1; returns both results once both exited 0 (asserts otherwise). A
    worker that exits non-zero ends the other at once (it would wait for its peer until gloo's 30 min timeout)."""
    import tempfile
    import time

    for attempt in range(tries):
        port = _free_port()
        with tempfile.TemporaryDirectory() as logs:
            procs, files = [], []
            for rank in (0, 1):
                e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                         OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
                out, err = open(Path(logs) / f"{rank}.out", "w+"), open(Path(logs) / f"{rank}.err", "w+")
                files.append((out, err))
                procs.append(subprocess.Popen([sys.executable, str(script)], env=e, cwd=cwd, stdout=out, stderr=err,
                                              text=True))
            deadline = time.monotonic() + timeout
            try:
                while any(p.poll() is None for p in procs):
                    if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            finally:
                timed_out = any(p.poll() is None for p in procs) and time.monotonic() > deadline
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                    p.wait()
            results = []
            for p, (out, err) in zip(procs, files):
                out.seek(0)
                err.seek(0)
                results.append(subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read()))
                out.close()
                err.close()
        if all(r.returncode == 0 for r in results):
            return results
        in_use = any("address already in use" in r.stderr.lower() for r in results)
        if not (in_use and attempt + 1 < tries):
            detail = "\n".join(f"--- rank {i} exited {r.returncode}\n{r.stderr[-3000:]}" for i, r in enumerate(results))
            raise AssertionError(f"a gloo worker failed{f' (killed after {timeout:g} s)' if timed_out else ''}\n{detail}")
    raise AssertionError("unreachable")
