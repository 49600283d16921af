"""`rewardkit ARGS` (the console script's entry point, ``rewardkit.cli.main``), or `python SCRIPT ARGS`, in processes
forked from this one.

Each run is a real process of its own: its own memory and exit status, and a SIGKILL (the trainers' kill hooks)
ends it alone. What it does not pay is a fresh Python start-up: torch, transformers and diffusers are already
imported here (seconds of CPU per process on a 2-core machine, more than a tiny run itself). The child gets one
torch thread, as the pytest process has (tests/conftest.py), the way a DataLoader worker does after a fork, and
accelerate's process-wide state (an earlier in-process run's) is reset, as in a new process.

:func:`run_forked_ranks` starts ``world`` such processes with the environment torchrun gives its workers
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so
``rewardkit.distributed.init_from_env`` joins one gloo group as under torchrun (as tests/helpers/gloo.py does
with fresh interpreters). torchrun itself, its agent and its exit report, is run by
docs/test_commands.py::test_run_every_unmarked_doc_command (docs/rl.md's 2-process line) and
bench/test_cli.py::test_every_rank_exits_with_the_same_code_under_torchrun.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence


def _child(argv: Sequence[str], env: dict[str, str], cwd: Path | str | None, stdio: Sequence[int],
           whole_env: bool) -> None:
    """In the forked process, with ``stdio`` (stdin, stdout, stderr) as fds 0-2 and ``env`` added to this
    process's environment (``whole_env``: as the whole environment): never returns (os._exit), so nothing of pytest
    runs here after the command."""
    rc = 1
    try:
        for fd, target in zip(stdio, (0, 1, 2)):
            os.dup2(fd, target)
        # pytest's capture objects write to its own files, not to fds 1 / 2
        sys.stdin = open(0, closefd=False)
        sys.stdout, sys.stderr = open(1, "w", buffering=1, closefd=False), open(2, "w", buffering=1, closefd=False)
        if whole_env:
            os.environ.clear()
        os.environ.update(env)
        script = argv[0] if isinstance(argv[0], Path) else None  # a Python script, as `python SCRIPT ARGS` runs it
        sys.argv = [str(script), *map(str, argv[1:])] if script else ["rewardkit", *map(str, argv)]
        if cwd is not None:
            os.chdir(cwd)
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise RuntimeError("the forking process is in a process group: a forked rank would reuse it")
        if "accelerate.state" in sys.modules:  # process-wide state of an earlier run here: start as a new process
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(reset_partial_state=True)
        try:
            if script:
                import runpy

                sys.path.insert(0, str(Path(script).resolve().parent))  # as `python SCRIPT` puts it first
                runpy.run_path(str(script), run_name="__main__")
                rc = 0
            else:
                from rewardkit.cli import main

                rc = main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the child's stderr, exit 1 as an uncaught error would
        import traceback

        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc if isinstance(rc, int) else 1)


def _warm() -> None:
    """Import here, once, what every scoring command imports (torch, transformers' model code, rewardkit's model
    zoo: seconds of CPU), so that each fork starts with it; a command's other lazy imports happen in its fork."""
    import rewardkit.models.zoo  # noqa: F401
    import rewardkit.registry  # noqa: F401
    import rewardkit.reward  # noqa: F401
    import torch  # noqa: F401
    import transformers.modeling_utils  # noqa: F401


def _fork(argv, env, cwd, stdio: Sequence[int], whole_env: bool = False) -> int:
    _warm()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(argv, env, cwd, stdio, whole_env)
    return pid


def _start(argv, env, cwd, logs: Path, name: str) -> tuple[int, Path, Path]:
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    with open(os.devnull) as i, open(out, "w") as o, open(err, "w") as e:
        pid = _fork(argv, env, cwd, [i.fileno(), o.fileno(), e.fileno()])
    return pid, out, err


def _wait(pids: list[int], timeout: float, stop_on_failure: bool) -> dict[int, int]:
    """Exit codes by pid (minus the signal for a killed one); the rest killed at the deadline, or as soon as one
    crashed (exit 1: an uncaught error, or a signal) when ``stop_on_failure``: a gloo peer would wait for it for
    30 minutes. rewardkit's own statuses (2 usage, 3 some samples invalid) are answers, not crashes."""
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        failed = stop_on_failure and any(c == 1 or c < 0 for c in codes.values())
        if len(codes) < len(pids) and (failed or time.monotonic() > deadline):
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, 9)
                    codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            break
        time.sleep(0.02)
    return codes


def _result(argv, code: int, out: Path, err: Path) -> subprocess.CompletedProcess:
    cmd = ["python" if isinstance(argv[0], Path) else "rewardkit", *map(str, argv)]
    return subprocess.CompletedProcess(cmd, code, out.read_text(), err.read_text())


def run_forked(argv: Sequence[str | Path], env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``rewardkit ARGV`` in one forked process with ``env`` added to this one's environment (returncode ``-9``:
    SIGKILLed; killed at ``timeout``). ``ARGV[0]`` a ``Path``: ``python ARGV`` (the script as ``__main__``)."""
    with tempfile.TemporaryDirectory() as logs:
        pid, out, err = _start(argv, dict(env or {}), cwd, Path(logs), "run")
        return _result(argv, _wait([pid], timeout, False)[pid], out, err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_forked_ranks(argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                     world: int = 2, timeout: float = 600, tries: int = 3) -> list[subprocess.CompletedProcess]:
    """``rewardkit ARGV`` as ranks 0..world-1 of one gloo group; each rank's result, in rank order. A rank that
    crashes ends the others at once. The store's port is picked free just before the start; if it was
    taken in between (the only race), the start is retried on another port."""
    for attempt in range(tries):
        port = str(_free_port())
        with tempfile.TemporaryDirectory() as logs:
            started = []
            for rank in range(world):
                e = dict(env or {}, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                         LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
                started.append(_start(argv, e, cwd, Path(logs), f"rank{rank}"))
            codes = _wait([pid for pid, _, _ in started], timeout, stop_on_failure=True)
            results = [_result(argv, codes[pid], out, err) for pid, out, err in started]
        if not any("address already in use" in r.stderr.lower() for r in results) or attempt + 1 == tries:
            return results
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------- scripts calling rewardkit
_SHIM = """#!{python} -S
# `rewardkit` for a script under test: hands argv, cwd, environment and stdio to the test process, which runs the
# command in a process forked from it; exits with that process's status (or dies of its signal)
import json, os, signal, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(os.environ["REWARDKIT_TEST_SERVER"])
req = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(s, [json.dumps(req).encode()], [0, 1, 2])
code = int(s.recv(64) or b"1")
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""
_ACTIVATE = """# the activate script of a venv whose `rewardkit` is served by the test process, `python` the real one's
VIRTUAL_ENV={venv}
export VIRTUAL_ENV
PATH="$VIRTUAL_ENV/bin:$PATH"
export PATH
hash -r 2>/dev/null || true
"""


def _serving_venv(root: Path, sock: Path) -> Path:
    """A venv folder for ``REWARDKIT_VENV``: ``bin/python`` runs this interpreter (its packages), ``bin/rewardkit``
    is the shim above."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "rewardkit").write_text(_SHIM.format(python=sys.executable))
    (venv / "bin" / "activate").write_text(_ACTIVATE.format(venv=venv))
    for name in ("python", "rewardkit"):
        (venv / "bin" / name).chmod(0o755)
    return venv


def run_script(cmd: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``bash -c CMD`` for real (the scripts, their `. _env.sh` and activate, their arguments and exit codes), with
    ``REWARDKIT_VENV`` a venv whose ``rewardkit`` runs each command as a process forked from this one, on the
    script's own stdin / stdout / stderr, in its directory and environment, its exit status the script's to see:
    what a console script does, without a fresh Python importing torch and transformers for every line."""
    import json
    import select

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sock = root / "rk.sock"
        venv = _serving_venv(root, sock)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        srv.bind(str(sock))
        srv.listen(4)
        full = dict(env, REWARDKIT_VENV=str(venv), REWARDKIT_TEST_SERVER=str(sock))
        with open(root / "out", "w+") as out, open(root / "err", "w+") as err, srv:
            proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=full, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err)
            deadline = time.monotonic() + timeout
            try:
                while proc.poll() is None and time.monotonic() < deadline:
                    if not select.select([srv], [], [], 0.05)[0]:
                        continue
                    conn, _ = srv.accept()
                    with conn:
                        msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
                        req = json.loads(msg)
                        req["env"].pop("REWARDKIT_TEST_SERVER", None)
                        try:
                            pid = _fork(req["argv"], req["env"], req["cwd"], fds, whole_env=True)
                        finally:
                            for fd in fds:
                                os.close(fd)
                        code = _wait([pid], max(deadline - time.monotonic(), 1), False)[pid]
                        conn.send(str(code).encode())
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            out.seek(0)
            err.seek(0)
            res = subprocess.CompletedProcess(["bash", "-c", cmd], proc.returncode, out.read(), err.read())
            res.venv = str(venv)  # the REWARDKIT_VENV the script ran with (gone once this returns)
            return res
