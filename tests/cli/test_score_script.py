"""The main job, as a user runs it: `bash scripts/score.sh` from another directory, relative paths, exit codes.

The script reuses this interpreter's environment (REWARDKIT_VENV + REWARDKIT_SKIP_INSTALL) and writes its
tiny demo checkpoints under a temporary folder; nothing outside the repository is needed. Its `rewardkit` lines run
as processes forked from the test process (tests/helpers/forked.py::run_script); the environment's own console
script is run by the demo test's fresh-shell `source .../bin/activate && rewardkit ls`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "score.sh"
IMAGES = REPO / "examples" / "images"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = dict(os.environ)
    e.update(REWARDKIT_VENV=sys.prefix, REWARDKIT_SKIP_INSTALL="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
             REWARDKIT_DEMO_CACHE=str(tmp_path_factory.mktemp("demo-cache")), TOKENIZERS_PARALLELISM="false")
    return e


def _run(args, cwd, env, timeout=600):
    """`bash scripts/score.sh ARGS` for real, each `rewardkit` line it runs a process forked from this one
    (tests/helpers/forked.py::run_script: the script's argv, directory, environment, stdio and exit status,
    without a fresh Python importing torch for every line)."""
    import shlex

    from tests.helpers.forked import run_script

    return run_script(shlex.join(["bash", str(SCRIPT), *args]), cwd, env, timeout=timeout)


def test_shipped_images_are_small_licensed_and_listed():
    pngs = sorted(IMAGES.glob("*.png"))
    assert 4 <= len(pngs) <= 12 and sum(p.stat().st_size for p in pngs) < 400_000
    assert (IMAGES / "LICENSE").is_file() and "CC0" in (IMAGES / "LICENSE").read_text()
    listed = (IMAGES / "README.md").read_text()
    assert all(p.name in listed for p in pngs)


@pytest.mark.slow
def test_relative_paths_from_another_directory_and_empty_folder(tmp_path, env):
    """Two real runs of the script: a folder with a broken image among good ones, from another
    directory (relative input and `-o` paths; exit 3, the good rows scored), and an empty folder (exit 2). The
    all-scored exit 0 of the same path: README's `bash scripts/score.sh examples/images/ ...`, run verbatim by
    docs/test_commands.py::test_run_every_unmarked_doc_command; the pass-through of each status:
    docs/test_readme.py::test_score_sh_with_arguments_uses_the_demo_cache_and_returns_rewardkits_status."""
    work = tmp_path / "elsewhere"
    (work / "imgs").mkdir(parents=True)
    for name in ("t2i_red_apple.png", "t2i_open_sign.png"):
        shutil.copy(IMAGES / name, work / "imgs" / name)
    (work / "imgs" / "broken.png").write_bytes(b"not a png")
    res = _run(["imgs", "--prompt", "a red apple", "-o", "out/scores.jsonl", "--no-progress"], work, env)
    assert res.returncode == 3 and "1 of 3 images invalid" in res.stderr, res.stderr
    assert "imgs/t2i_red_apple.png" in res.stdout and "imgs/t2i_open_sign.png" in res.stdout
    assert "broken.png" in res.stdout
    assert (work / "out" / "scores.jsonl").is_file()  # relative to the caller's directory, not the repo
    rows = [json.loads(x) for x in (work / "out" / "scores.jsonl").read_text().splitlines()]
    assert sorted((Path(r["image"]).name, r["valid"]) for r in rows) == [
        ("broken.png", False), ("t2i_open_sign.png", True), ("t2i_red_apple.png", True)]

    (work / "empty").mkdir()
    res = _run(["empty", "--prompt", "a red apple"], work, env)
    assert res.returncode == 2 and "holds no image files" in res.stderr, res.stderr


@pytest.mark.slow
def test_demo_without_arguments_shows_t2i_edit_and_compare(tmp_path, env):
    res = _run([], tmp_path, env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for name in ("t2i_red_apple.png", "t2i_house_sunset.png", "t2i_open_sign.png", "edit_result_red_ball.png",
                 "edit_result_green_ball.png"):
        assert name in out
    assert "preferred over" in out and "NaN" not in out
    assert "== 2. image editing" in res.stderr and "all 2 images scored" in res.stderr
    # the last step: one HTML report of the three outputs, with the three example images and their scores
    report = REPO / "outputs" / "report.html"
    assert f"report: {report}" in res.stderr
    import re

    html = report.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="rk-data">(.*?)</script>', html, re.S).group(1))
    t2i = [json.loads(line) for line in (REPO / "outputs" / "t2i_scores.jsonl").read_text().splitlines()]
    sec = next(s for s in data["sections"] if s["label"] == "t2i_scores")
    assert [(r["path"], r["score"]) for r in sec["rows"]] == [(r["image"], r["score"]) for r in t2i]
    assert sorted(data["images"][r["img"]]["name"] for r in sec["rows"]) == [
        "t2i_house_sunset.png", "t2i_open_sign.png", "t2i_red_apple.png"]
    assert all(data["images"][r["img"]]["src"].startswith("data:image/") for r in sec["rows"])
    assert [s["kind"] for s in data["sections"]] == ["scores", "scores", "pairs"]
    # the README's "A first result" is this run's output, line for line (seeded tiny checkpoints)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shown = readme[readme.index("## A first result"):].split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert shown and all(line.rstrip() in out.splitlines() for line in shown), (shown, out)
    # ... and the README's next lines work in a fresh shell: the `source` line score.sh ends with, then rewardkit
    src = next(x.strip() for x in res.stderr.splitlines() if x.strip().startswith("source "))
    assert src == f"source {res.venv}/bin/activate"  # the environment it ran in; here: the one it stands for
    src = f"source {env['REWARDKIT_VENV']}/bin/activate"
    fresh = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if os.environ.get("PYTHONPATH"):  # a worktree under test: its code, as the rest of the suite uses
        fresh["PYTHONPATH"] = os.environ["PYTHONPATH"]
    assert subprocess.run(["bash", "-c", "rewardkit ls"], env=fresh, capture_output=True).returncode == 127
    walk = subprocess.run(["bash", "-c", f"{src} && rewardkit ls"], cwd=tmp_path, env=fresh, capture_output=True,
                          text=True, timeout=120)
    assert walk.returncode == 0 and "pickscore" in walk.stdout, walk.stderr
