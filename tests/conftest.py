"""Session-wide fixtures: heavy imports and tiny checkpoints are built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# One torch (OpenMP / MKL) thread, here and in the subprocesses tests start (they inherit the environment):
# the tiny models' ops are too small to split, and on a shared 2-core machine two OpenMP threads spin-wait on
# each other. Measured on the tiny EditReward (2 samples per call, load average 11): 0.69 s CPU and 3.4 s wall
# per call with 2 threads, 0.08 s CPU and 0.45 s wall with 1. A test that needs more threads sets them itself;
# an exported OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
EDIT_EXAMPLE = SHARED / "fixtures" / "edit_example"


def pytest_configure(config):
    torch = sys.modules.get("torch")  # imported before this file (by a plugin): the variable came too late
    if torch is not None:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_clip_dir(tiny_root) -> Path:
    from rewardkit.testing import save_tiny_checkpoint

    return save_tiny_checkpoint("clip", tiny_root / "clip")


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl_dir(tiny_root) -> Path:
    from rewardkit.testing import save_tiny_checkpoint

    return save_tiny_checkpoint("qwen2_5_vl", tiny_root / "qwen2_5_vl")


@pytest.fixture(scope="session")
def tiny_qwen3_vl_dir(tiny_root) -> Path:
    from rewardkit.testing import save_tiny_checkpoint

    return save_tiny_checkpoint("qwen3_vl", tiny_root / "qwen3_vl")


@pytest.fixture(scope="session")
def edit_example() -> Path:
    if not EDIT_EXAMPLE.is_dir():
        pytest.skip("../shared/fixtures/edit_example is not present")
    return EDIT_EXAMPLE


# --- slow marks that hold ------------------------------------------------------------------------------------------
# An unmarked test must stay fast, or the `-m "not slow"` inner loop grows unnoticed. Under CI (CI=true) or with
# REWARDKIT_CHECK_SLOW_MARKS=1, the session fails when an unmarked test's own run (the call phase, not session
# fixtures it happens to build first) takes longer than REWARDKIT_UNMARKED_LIMIT_S (default 10 s); the fix is
# `@pytest.mark.slow` (or a faster test). Tests whose calls take over ~4 s on this machine size are marked.
_UNMARKED_LIMIT_S = float(os.environ.get("REWARDKIT_UNMARKED_LIMIT_S", "10"))
_unmarked_too_slow: list[tuple[str, float]] = []


def _check_slow_marks() -> bool:
    return os.environ.get("REWARDKIT_CHECK_SLOW_MARKS", "1" if os.environ.get("CI") else "0") not in ("", "0")


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed and "slow" not in report.keywords \
            and report.duration > _UNMARKED_LIMIT_S:
        _unmarked_too_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter):
    if _unmarked_too_slow:
        terminalreporter.section("tests without @pytest.mark.slow over the limit")
        for nodeid, seconds in sorted(_unmarked_too_slow, key=lambda t: -t[1]):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
        terminalreporter.write_line(f"limit {_UNMARKED_LIMIT_S:g} s (REWARDKIT_UNMARKED_LIMIT_S); mark them slow"
                                    + ("" if _check_slow_marks() else " (not enforced outside CI)"))


def pytest_sessionfinish(session, exitstatus):
    if _unmarked_too_slow and _check_slow_marks() and exitstatus == 0:
        session.exitstatus = 1


# --- one local Ray cluster for the session ---------------------------------------------------------------------------
# Started by the first test that asks for it (tests/datasets/test_ray.py, tests/serve/test_ray_serve.py, the Ray
# Serve GPU script's dry run), shut down at the session's end: each ray.init of a new cluster costs seconds. Ray
# actors get one torch thread (OMP_NUM_THREADS in the workers' environment), which byte-identical output needs
# (the same float summation order as this process, where the tests set one thread too). Drivers of their own
# (a CLI in a subprocess) join it with ``--ray-address`` = the fixture's value (the cluster's GCS address). A test
# that leaves something running on it (a Serve app, Serve itself) removes it in its own teardown.
def pytest_collection_modifyitems(config, items):
    """The tests on the session's Ray cluster run last (in their collected order): once it is up, this process holds
    Ray's driver threads, and tests/helpers/forked.py forks this process; no fork comes after them."""
    items[:] = [i for i in items if "ray_cluster" not in getattr(i, "fixturenames", ())] + \
        [i for i in items if "ray_cluster" in getattr(i, "fixturenames", ())]


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
