"""scripts/readme_walk.sh, the fresh-shell walk of the README (issue 40, "Done when"): a fresh clone, an empty
HOME, `env -i`, then the README's commands verbatim. The walk itself installs torch and the hf / train extras
into a new virtual environment (minutes), so the suite does not run it (its last run, 2026-12-06 at 6e493cf on a
2-core machine under load 7: every step passed, Get started 203 s, A first result 15 s, In Python 15 s); what is
checked here, in milliseconds, is that the walk runs what the README says: every
command line of "Get started" and "A first result", but `bash scripts/test.sh` and a line under `# ... needs`,
and the "In Python" block as it is."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("python3") is None,
                                reason="needs bash and python3")


def _block(heading: str, lang: str) -> str:
    section = README[README.index(f"\n## {heading}\n"):].split("\n## ", 2)[1]
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def _plan(*args: str) -> dict[str, list[str]]:
    res = subprocess.run(["bash", str(REPO / "scripts" / "readme_walk.sh"), "--print", *args], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out: dict[str, list[str]] = {}
    key = None
    for line in res.stdout.splitlines():
        if line.startswith("== "):
            key = line[3:]
            out[key] = []
        elif key is not None:
            out[key].append(line)
    return out


def test_the_walk_runs_every_readme_command_but_the_test_suite_and_what_needs_weights():
    plan = _plan()
    for heading in ("Get started", "A first result"):
        commands = [x for x in _block(heading, "bash").splitlines() if x.strip() and not x.startswith("#")]
        run = [x[len("run: "):] for x in plan[heading] if x.startswith("run: ")]
        skipped = [x.split("): ", 1)[1] for x in plan[heading] if x.startswith("skip (")]
        assert sorted(run + skipped) == sorted(commands), heading          # nothing dropped, nothing invented
        for line in skipped:
            assert line.startswith("bash scripts/test.sh") or "real weights" in _block(heading, "bash").split(line)[0] \
                .splitlines()[-1], line
    start = [x[len("run: "):].split("#")[0].strip() for x in plan["Get started"] if x.startswith("run: ")]
    assert start == ["bash scripts/score.sh", "source .venv/bin/activate", "rewardkit ls"]  # in the README's order
    assert "\n".join(plan["In Python"]).strip() == _block("In Python", "python").strip()


def test_with_tests_the_walk_runs_the_test_suite_too():
    run = [x for x in _plan("--with-tests")["Get started"] if x.startswith("run: ")]
    assert any(x.startswith("run: bash scripts/test.sh") for x in run)


def test_the_walk_starts_from_nothing():
    """A fresh HOME (no pip cache, no user config), `env -i` (no activated venv, no inherited PATH), a clone."""
    script = (REPO / "scripts" / "readme_walk.sh").read_text()
    assert 'env -i "HOME=$TMP/home" "PATH=/usr/local/bin:/usr/bin:/bin"' in script
    assert 'git clone -q "$REPO" "$TMP/rewardkit"' in script
    assert "REWARDKIT_" not in script.split("ENV=(", 1)[1].split("\n", 1)[0]   # nothing of ours is passed in


def test_ci_runs_the_walk_before_the_test_suite():
    """The walk is CI's own step (it installs for about a minute: not in the pytest suite); dropping it from
    `.ci/run`, or running it after `exec` (never reached), would leave the README's commands untested."""
    ci = (REPO / ".ci" / "run").read_text()
    steps = [line for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    walk = [i for i, line in enumerate(steps) if "bash scripts/readme_walk.sh" in line]
    tests = [i for i, line in enumerate(steps) if line.startswith("exec bash scripts/test.sh")]
    assert walk and tests and walk[0] < tests[0], steps
