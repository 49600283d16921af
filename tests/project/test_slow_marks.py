"""The conftest check that keeps `-m "not slow"` fast: an unmarked test over the limit fails the session in CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"  # the root conftest (tests/conftest.py)

BODY = """
import time
import pytest

{mark}
def test_sleeps():
    time.sleep(0.5)
"""


def _run(tmp_path: Path, mark: str, **env: str) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_sleepy.py").write_text(BODY.format(mark=mark))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    full_env = {k: v for k, v in os.environ.items() if k not in ("CI", "REWARDKIT_CHECK_SLOW_MARKS")}
    full_env.update(REWARDKIT_UNMARKED_LIMIT_S="0.2", **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("mark, env, rc", [
    ("", {"CI": "true"}, 1),                                   # unmarked and over the limit in CI: fails
    ("", {"REWARDKIT_CHECK_SLOW_MARKS": "1"}, 1),              # or when asked for outside CI
    ("", {}, 0),                                               # a developer's run only reports it
    ("@pytest.mark.slow", {"CI": "true"}, 0),                  # marked: fine
])
def test_unmarked_slow_test_fails_the_session_in_ci(tmp_path, mark, env, rc):
    res = _run(tmp_path, mark, **env)
    assert res.returncode == rc, res.stdout[-2000:]
    listed = "tests without @pytest.mark.slow over the limit" in res.stdout
    assert listed == (mark == ""), res.stdout[-2000:]
