"""benchmarks/peers.py reports a worker that dies mid-request (the official HPSv3's padded batch of 32 mixed sizes
is killed by the out-of-memory killer on a 24 GiB machine) as that row's error, with how it ended and the largest
RSS seen, and goes on with a fresh worker: a benchmark says what it measured and does not fail."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"


def _peers():
    spec = importlib.util.spec_from_file_location("peers_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# a worker that says it is ready, answers one request, then is killed by SIGKILL on the next
_DYING = ("import json, os, signal, sys\n"
          "print(json.dumps({'ready': True}), flush=True)\n"
          "sys.stdin.readline(); print(json.dumps({'ok': 1}), flush=True)\n"
          "sys.stdin.readline(); os.kill(os.getpid(), signal.SIGKILL)\n")


def test_a_killed_worker_is_reported_with_its_exit_and_a_fresh_one_takes_over():
    peers = _peers()
    w = peers.Worker([sys.executable, "-c", _DYING], {})
    assert w.ready == {"ready": True}
    assert w.ask(x=1) == {"ok": 1}
    with pytest.raises(peers.WorkerDied, match=r"exit -9 \(SIGKILL: out of memory\?\); largest RSS seen \d+ MiB"):
        w.ask(x=2)
    fresh = w.restart()
    try:
        assert fresh.p.pid != w.p.pid and fresh.ready == {"ready": True} and fresh.ask(x=1) == {"ok": 1}
    finally:
        fresh.p.kill()
        fresh.p.wait()
