"""The GPU smoke scripts run unchanged on a device machine; their CPU dry-run modes run here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_vllm_smoke_dry_run():
    pytest.importorskip("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "vllm_smoke.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert [ln.split()[1].rstrip(":") for ln in lines] == [
        "label-probs", "order-independence", "seeded-sampling", "greedy-n>1", "prefix-caching"]
    assert all(ln.startswith("PASS") for ln in lines)
