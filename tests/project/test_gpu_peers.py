"""benchmarks/gpu/peers.py (issue 41's side-by-side on a lent GPU) runs unchanged: its --dry-run takes the same code
path on the CPU against the official packages' parity environments; its agreement figure is the parity bound."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "peers.py"
VENVS = Path(os.environ.get("PARITY_VENVS", Path.home() / ".cache" / "rewardkit" / "parity"))
WORK = Path.home() / ".cache" / "rewardkit" / "peers" / "work"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_peers_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_agreement_is_the_parity_bound():
    """scripts/parity.sh's bound, |official - rk| <= 1e-5 * max(scale, |official|), scale = max |official|;
    a NaN on either side is NaN, wherever it sits (max() alone keeps or drops it by position)."""
    agreement = _script().agreement
    # scale 4; worst pair: |2 - 2.00002| / max(4, 2) = 5e-6 -> half the tolerance
    diff, over = agreement([2.0, -4.0], [2.00002, -4.00001])
    assert diff == pytest.approx(5e-6) and over == pytest.approx(0.5)
    # a score above the scale is compared on its own size: |8 - 8.0008| / 8 = 1e-4 -> 10x the tolerance
    diff, over = agreement([8.0, 1.0], [8.0008, 1.0])
    assert diff == pytest.approx(1e-4) and over == pytest.approx(10.0)
    for off, rk in (([1.0, 2.0], [1.0, math.nan]), ([1.0, 2.0], [math.nan, 2.0]), ([math.nan, 2.0], [1.0, 2.0])):
        assert all(math.isnan(x) for x in agreement(off, rk))
    with pytest.raises(ValueError, match="1 official scores vs 2"):
        agreement([1.0], [1.0, 1.0])


@pytest.mark.slow
def test_gpu_peers_script_dry_run():
    """The GPU run's code on the CPU: the official hpsv2 package (its parity environment) and rewardkit on the tiny
    checkpoint, 1 round, batch 1 and 2, mixed sizes; the half row is skipped with its reason on the CPU."""
    if not any((p / ".done").exists() for p in VENVS.glob("hpsv2-*")):
        pytest.skip(f"no hpsv2 parity environment under {VENVS} (scripts/parity.sh hpsv2 builds it; CI does)")
    if not (WORK / "hpsv2" / "converted" / "rewardkit.json").exists():
        pytest.skip(f"no tiny hpsv2 checkpoint under {WORK} (python benchmarks/peers.py --models hpsv2 writes it)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--models", "hpsv2"], capture_output=True,
                         text=True, timeout=600, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert re.search(r"^device cpu; workers up in \d+ s; .*1 interleaved rounds of 2 images", out, re.M), out
    assert re.search(r"^model +precision +sizes +batch +wall x +cpu x .*GPU peak off/rk MiB .*rk own$", out, re.M)
    rows = re.findall(r"^hpsv2 +float32 +mixed +(\d+) +([\d.]+)x +([\d.]+)x .* (ok|OVER) .* n/a/n/a ", out, re.M)
    assert [r[0] for r in rows] == ["1", "2"], out
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert all(r[3] == "ok" for r in rows), out  # same scores within the parity tolerance
    assert "hpsv2        half      skipped: the official package has no half mode on cpu" in out
    assert "hpsv2 float32: official float32, rewardkit float32" in out and "2 rows in" in out


def test_gpu_run_needs_a_cuda_device(capsys):
    """Without --dry-run on a machine with no GPU it says so and exits 2, before starting any worker."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert _script().main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_a_worker_without_cuda_says_so_in_its_row(tmp_path):
    """A side whose torch sees no CUDA device (a parity environment built with a CPU-only torch) answers every
    request with that error, which the driver prints in the row, instead of scoring on the CPU."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    res = subprocess.run([sys.executable, str(SCRIPT), "--worker", "rewardkit", "hpsv2", str(tmp_path), "cuda:0"],
                         input='{"load": "half"}\n{"paths": ["x.png"], "prompt": "p", "batch": 1}\n',
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    ready, *answers = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert ready["device"] == "cpu" and len(answers) == 2
    assert all(a["error"].startswith("RuntimeError: torch ") and "sees no CUDA device" in a["error"] for a in answers)
