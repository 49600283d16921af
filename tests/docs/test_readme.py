"""README claims, and those of the pages its reference sections moved to (docs/install.md, docs/contract.md,
docs/commands.md, docs/architecture.md), outside the contract / security sections (map: tests/README.md, "README:
setup, commands and the rest"): the scripts' environment variables and exit status, REWARDKIT_DEBUG, the extras
table, the "Writing a reward" example, the Layout block, the GPU scripts' --dry-run and the README's own shape.

The scripts are run by bash against a fake virtual environment (`bin/python`, `bin/rewardkit` that log their
arguments and exit with a chosen code), so what they would install / run is checked in milliseconds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
# the README's reference sections moved to these pages (issue 40): each claim is checked where it is written
INSTALL = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
CONTRACT = (REPO / "docs" / "contract.md").read_text(encoding="utf-8")
COMMANDS_PAGE = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

_FAKE_PY = """#!/usr/bin/env bash
echo "python $*" >> "$FAKE_LOG"
if [ "$1" = "-c" ]; then exit "${FAKE_TORCH_RC:-1}"; fi
if [ "$1" = "-" ]; then cat > /dev/null; fi
exit 0
"""
_FAKE_RK = """#!/usr/bin/env bash
echo "rewardkit[$(pwd)] $*" >> "$FAKE_LOG"
exit "${FAKE_RK_RC:-0}"
"""
# PYTHON=...: the interpreter that creates the environment (`-m venv DIR`)
_FAKE_CREATOR = """#!/usr/bin/env bash
echo "creator $*" >> "$FAKE_LOG"
[ "$1 $2" = "-m venv" ] || exit 9
mkdir -p "$3/bin"
printf 'export PATH="%s/bin:$PATH"\\n' "$3" > "$3/bin/activate"
cp "$FAKE_DIR/python" "$3/bin/python"; cp "$FAKE_DIR/rewardkit" "$3/bin/rewardkit"
chmod +x "$3/bin/python" "$3/bin/rewardkit"
"""


@pytest.fixture()
def fake(tmp_path):
    d = tmp_path / "fakes"
    d.mkdir()
    for name, body in (("python", _FAKE_PY), ("rewardkit", _FAKE_RK), ("creator", _FAKE_CREATOR)):
        (d / name).write_text(body)
        (d / name).chmod(0o755)
    log = tmp_path / "log.txt"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REWARDKIT_", "PIP_", "VIRTUAL_ENV"))}
    env.update(FAKE_LOG=str(log), FAKE_DIR=str(d), PYTHON=str(d / "creator"))
    return env, log, tmp_path


def _bash(cmd, env, cwd, **extra):
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env={**env, **extra}, capture_output=True, text=True,
                          timeout=60)


def _lines(log):
    return log.read_text().splitlines()


@needs_bash
def test_env_creates_venv_with_python_installs_rewardkit_torch_first_and_keeps_the_choice(fake):
    env, log, tmp = fake
    venv = tmp / "myvenv"
    rel = os.path.relpath(venv, REPO)  # REWARDKIT_VENV relative to the repository, not to the caller
    torch_spec = "torch==9.9.9 --index-url https://example.invalid/whl/cpu"
    res = _bash(f". {REPO}/scripts/_env.sh hf", env, tmp, REWARDKIT_VENV=rel, REWARDKIT_TORCH=torch_spec)
    assert res.returncode == 0, res.stderr
    lines = _lines(log)
    assert lines[0] == f"creator -m venv {REPO}/{rel}"
    pips = [x for x in lines if x.startswith("python -m pip install")]
    assert len(pips) == 3 and "--upgrade pip" in pips[0]
    assert pips[1].endswith(torch_spec)                     # before anything else, with its pip options
    assert pips[2] == f"python -m pip install -q -e {REPO}[hf]"
    assert lines.index(pips[1]) < lines.index(pips[2])
    # a second run (same pyproject, extras covered) installs nothing: the choice is kept in the venv
    log.write_text("")
    assert _bash(f". {REPO}/scripts/_env.sh hf", env, tmp, REWARDKIT_VENV=rel).returncode == 0
    assert not [x for x in _lines(log) if "pip install" in x or x.startswith("creator")]


@needs_bash
def test_env_default_torch_pin_and_no_reinstall_when_torch_is_there(fake):
    env, log, tmp = fake
    res = _bash(f". {REPO}/scripts/_env.sh hf,train", env, tmp, REWARDKIT_VENV=str(tmp / "v"))
    assert res.returncode == 0, res.stderr
    torch_pip = [x for x in _lines(log) if "pip install" in x and "torch" in x]
    assert len(torch_pip) == 1 and torch_pip[0].endswith("torch==2.13.0")   # README's default
    # torch already importable: nothing reinstalled for it (rewardkit itself still is, new extras)
    log.write_text("")
    res = _bash(f". {REPO}/scripts/_env.sh hf,bench", env, tmp, REWARDKIT_VENV=str(tmp / "v"), FAKE_TORCH_RC="0")
    pips = [x for x in _lines(log) if "pip install" in x]
    assert res.returncode == 0 and not [x for x in pips if "torch" in x]
    assert pips[-1] == f"python -m pip install -q -e {REPO}[hf,bench]"


@needs_bash
def test_first_install_says_what_it_is_doing_at_each_step(fake):
    """A first run is minutes of pip: each stage gets a line on stderr (the step, the elapsed time, what it
    installs), never minutes of silence after one line; a run with nothing to install prints none of them."""
    env, log, tmp = fake
    res = _bash(f". {REPO}/scripts/_env.sh hf,train", env, tmp, REWARDKIT_VENV=str(tmp / "v"))
    assert res.returncode == 0, res.stderr
    steps = [x for x in res.stderr.splitlines() if x.startswith("[rewardkit] step ")]
    assert [x.split()[2] for x in steps] == ["1/3", "2/3", "3/3"]
    assert "pip" in steps[0] and "PyTorch (torch==2.13.0)" in steps[1] and "rewardkit-vision[hf,train]" in steps[2]
    assert all(" s): " in x for x in steps) and "[rewardkit] installed in " in res.stderr
    assert "several minutes" in res.stderr
    res = _bash(f". {REPO}/scripts/_env.sh hf,bench", env, tmp, REWARDKIT_VENV=str(tmp / "v"), FAKE_TORCH_RC="0")
    steps = [x for x in res.stderr.splitlines() if x.startswith("[rewardkit] step ")]
    assert "PyTorch is already installed" in steps[1]
    log.write_text("")
    res = _bash(f". {REPO}/scripts/_env.sh hf", env, tmp, REWARDKIT_VENV=str(tmp / "v"))
    assert "[rewardkit] step" not in res.stderr  # covered by the stamp: nothing to do, nothing said
    assert res.returncode == 0 and not [x for x in _lines(log) if "pip install" in x]  # and nothing installed


@needs_bash
def test_skip_install_uses_the_environment_as_it_is(fake):
    env, log, tmp = fake
    subprocess.run([env["PYTHON"], "-m", "venv", str(tmp / "v")], env=env, check=True)
    log.write_text("")
    res = _bash(f". {REPO}/scripts/_env.sh all,dev", env, tmp, REWARDKIT_VENV=str(tmp / "v"),
                REWARDKIT_SKIP_INSTALL="1")
    assert res.returncode == 0, res.stderr
    assert _lines(log) == []


@pytest.fixture()
def venv(fake):
    env, log, tmp = fake
    subprocess.run([env["PYTHON"], "-m", "venv", str(tmp / "v")], env=env, check=True)
    log.write_text("")
    env = {**env, "REWARDKIT_VENV": str(tmp / "v"), "REWARDKIT_SKIP_INSTALL": "1",
           "REWARDKIT_DEMO_CACHE": str(tmp / "democache")}
    return env, log, tmp


@needs_bash
@pytest.mark.parametrize("rc", [0, 1, 2, 3])
def test_score_sh_with_arguments_uses_the_demo_cache_and_returns_rewardkits_status(venv, rc):
    env, log, tmp = venv
    res = _bash(f"bash {REPO}/scripts/score.sh imgs/ --prompt 'a red apple'", env, tmp, FAKE_RK_RC=str(rc))
    assert res.returncode == rc, res.stderr
    cache = tmp / "democache"
    assert _lines(log) == [f"python - {cache}/tiny-clip {cache}/tiny-preference",   # checkpoints written there
                           f"rewardkit[{tmp}] score --reward pickscore --model {cache}/tiny-clip imgs/ --prompt a red apple"]


@needs_bash
def test_score_sh_with_reward_passes_everything_through(venv):
    env, log, tmp = venv
    res = _bash(f"bash {REPO}/scripts/score.sh --reward pickscore --model /models/P a.png --prompt x", env, tmp,
                FAKE_RK_RC="3")
    assert res.returncode == 3
    assert _lines(log) == [f"rewardkit[{tmp}] score --reward pickscore --model /models/P a.png --prompt x"]


@needs_bash
def test_score_sh_demo_runs_t2i_edit_compare_into_outputs(venv):
    env, log, tmp = venv
    res = _bash(f"bash {REPO}/scripts/score.sh", env, tmp)
    assert res.returncode == 0, res.stderr
    rk = [x for x in _lines(log) if x.startswith("rewardkit[")]
    cache = tmp / "democache"
    assert len(rk) == 4 and all(x.startswith(f"rewardkit[{REPO}] ") for x in rk)
    assert "score --reward pickscore" in rk[0] and f"{cache}/tiny-clip" in rk[0]
    assert "--jsonl examples/images/t2i.jsonl --output outputs/t2i_scores.jsonl" in rk[0]
    assert "score --reward preference" in rk[1] and f"{cache}/tiny-preference" in rk[1]
    assert "--jsonl examples/images/edit.jsonl --output outputs/edit_scores.jsonl" in rk[1]
    assert rk[2].split("] ", 1)[1].startswith("compare --reward pickscore") and "--output outputs/compare.jsonl" in rk[2]
    assert rk[3].split("] ", 1)[1] == ("view outputs/t2i_scores.jsonl outputs/edit_scores.jsonl outputs/compare.jsonl "
                                       "-o outputs/report.html")
    assert f"report: {REPO}/outputs/report.html" in res.stderr
    # it ends with how to put `rewardkit` on the PATH of the user's own shell (the README says the same)
    tail = res.stderr.rstrip().splitlines()[-3:]
    assert tail[0].startswith("[rewardkit] next: activate") and tail[1].strip() == f"source {tmp}/v/bin/activate"
    assert "source .venv/bin/activate" in README
    # a failing step is the script's status
    log.write_text("")
    assert _bash(f"bash {REPO}/scripts/score.sh", env, tmp, FAKE_RK_RC="2").returncode == 2


def test_readme_lists_every_script_environment_variable_with_its_default():
    table = INSTALL[INSTALL.index("| variable | default | what |"):].split("\n\n", 1)[0]
    documented = dict(re.findall(r"^\| `(\w+)` \| (\S+) \|", table, re.M))
    assert documented == {"REWARDKIT_TORCH": "`torch==2.13.0`", "REWARDKIT_VENV": "`.venv`",
                          "REWARDKIT_SKIP_INSTALL": "unset", "REWARDKIT_DEMO_CACHE": "`.rewardkit_cache`",
                          "PYTHON": "`python3`"}
    scripts = (REPO / "scripts" / "_env.sh").read_text() + (REPO / "scripts" / "score.sh").read_text()
    assert set(re.findall(r"\$\{(REWARDKIT_\w+|PYTHON)[:}]", scripts)) == set(documented)
    assert "${REWARDKIT_TORCH:-torch==2.13.0}" in scripts and '${REWARDKIT_VENV:-.venv}' in scripts
    assert "${PYTHON:-python3}" in scripts and "${REWARDKIT_DEMO_CACHE:-$REPO/.rewardkit_cache}" in scripts


def test_rewardkit_debug_shows_the_traceback(monkeypatch, capsys):
    from rewardkit.cli import main
    from rewardkit.commands import ls
    from rewardkit.commands import UsageError

    def boom(args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(ls, "run", boom)
    monkeypatch.setenv("REWARDKIT_DEBUG", "1")
    assert main(["ls"]) == 1  # the traceback, and still the internal-error code
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: kaboom" in err

    def usage(args):
        raise UsageError("bad option")

    monkeypatch.setattr(ls, "run", usage)
    assert main(["ls"]) == 2  # a usage error stays exit 2 in debug mode (it used to escape as exit 1)
    err = capsys.readouterr().err
    assert "Traceback" in err and "UsageError: bad option" in err
    for off in ("0", "false", "", "off"):  # REWARDKIT_DEBUG=0 is off (it used to turn debug on)
        monkeypatch.setenv("REWARDKIT_DEBUG", off)
        assert main(["ls"]) == 2
        err = capsys.readouterr().err
        assert "bad option" in err and "Traceback" not in err
    monkeypatch.delenv("REWARDKIT_DEBUG")
    assert main(["ls"]) == 2 and "bad option" in capsys.readouterr().err


def _pyproject_extras() -> dict[str, list[str]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data["project"]["optional-dependencies"]


def test_extras_table_matches_pyproject():
    extras = _pyproject_extras()
    table = INSTALL[INSTALL.index("| extra | for | pulls |"):].split("\n\n", 1)[0].splitlines()[2:]
    rows = {m.group(1): m.group(2) for m in (re.match(r"\| `(\w+)` \|.*\|\s*([^|]*?)\s*\|$", r) for r in table) if m}
    assert set(rows) == set(extras) - {"dev"}
    name = re.compile(r"^[A-Za-z0-9_.-]+")
    for extra, pulls in rows.items():
        if extra == "all":
            continue
        have = {name.match(req).group(0).lower() for req in extras[extra]}
        want = {p.strip().lower() for p in pulls.split("(")[0].split(",") if p.strip()}
        assert want <= have, (extra, want - have)
    # `all` is every extra but the ones the README's `all` row names (`all` itself, vllm, docs, ...) and dev
    left_out = set(re.findall(r"`(\w+)`", next(r for r in table if r.startswith("| `all`"))))
    inner = re.match(r"rewardkit-vision\[(.*)\]", extras["all"][0]).group(1).split(",")
    assert {"vllm", "docs", "ray"} <= left_out
    assert len(extras["all"]) == 1 and set(inner) == set(extras) - left_out - {"dev"}


def test_layout_paths_exist():
    block = ARCHITECTURE[ARCHITECTURE.index("## Layout"):].split("```")[1]
    paths = set(re.findall(r"\b(rewardkit/[\w/.]*|tests/|benchmarks/|recipes/|docs/|examples/|scripts/)", block))
    paths |= {f"rewardkit/{p}" for p in re.findall(r"(?<=, )(\w+\.py)", block)}  # "server.py, client.py"
    paths |= {"rewardkit/commands/"} if "commands/" in block else set()
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, missing


def _readme_sharpness_source() -> str:
    sec = CONTRACT[CONTRACT.index("## Writing a reward"):]
    code = sec.split("```python", 1)[1].split("```", 1)[0]
    body = textwrap.dedent("""\
        import numpy as np
        values = []
        for im in batch.images:
            g = np.asarray(im.convert("L"), dtype=np.float64)
            lap = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4 * g[1:-1, 1:-1]
            values.append(self.config.scale * lap.var())
    """)
    assert code.count("        ...\n") == 1
    return code.replace("        ...\n", textwrap.indent(body, "        "))


def test_writing_a_reward_example_registers_and_passes_conformance(monkeypatch, tmp_path):
    """The README's Sharpness, with its `...` filled in, registered through the documented entry point."""
    import types
    from importlib import metadata

    import numpy as np
    from PIL import Image

    import rewardkit
    from rewardkit import registry
    from rewardkit.conformance import check_reward

    mod = types.ModuleType("my_pkg_rewards_readme")
    monkeypatch.setitem(sys.modules, "my_pkg_rewards_readme", mod)
    exec(compile(_readme_sharpness_source(), "docs/contract.md", "exec"), mod.__dict__)
    ep = metadata.EntryPoint(name="sharpness", value="my_pkg_rewards_readme:Sharpness",
                             group=registry.ENTRY_POINT_GROUP)
    assert registry.ENTRY_POINT_GROUP == "rewardkit.rewards"  # the group the README's toml names
    registry._reset()
    monkeypatch.setattr(registry.importlib_metadata, "entry_points", lambda group=None: [ep])
    try:
        assert "sharpness" in rewardkit.list_rewards()
        r = rewardkit.load_reward("sharpness", scale=2.0)
        assert isinstance(r, mod.Sharpness)
        check_reward(mod.Sharpness.tiny(tmp_path))
        # independent value: a single bright pixel in black, 5x5 -> 3x3 interior Laplacian
        a = np.zeros((5, 5, 3), np.uint8)
        a[2, 2] = 255
        lap = np.zeros((3, 3))
        lap[1, 1] = -4 * 255
        lap[0, 1] = lap[1, 0] = lap[1, 2] = lap[2, 1] = 255
        out = r([Image.fromarray(a)], "ignored")
        assert float(out.scores[0]) == pytest.approx(2.0 * lap.var(), rel=1e-5)
    finally:
        registry._reset()


@pytest.mark.slow
def test_nft_step_gpu_script_dry_run():
    """README 'On a GPU machine': each script's --dry-run runs the same code on the CPU (nft_step.py too)."""
    from tests.helpers.forked import run_forked

    # `python benchmarks/gpu/nft_step.py --dry-run ...` in a process forked from this one (no fresh Python start-up)
    res = run_forked([REPO / "benchmarks" / "gpu" / "nft_step.py", "--dry-run", "--iters", "1", "--batch", "2",
                      "--prompts", "2"], cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"device": "cpu"' in res.stdout and '"model": "tiny"' in res.stdout and '"e2po_step_s"' in res.stdout


def test_clipscore_text_prefix_is_prepended(tiny_clip_dir):
    """README "CLIPScore scale": Hessel et al. prepend "A photo depicts " (`text_prefix=`)."""
    from PIL import Image

    from rewardkit import load_reward

    img = Image.open(REPO / "examples" / "images" / "t2i_red_apple.png")
    plain = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    pre = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", text_prefix="A photo depicts ")
    assert plain.config.text_prefix == ""  # off by default
    with_prefix = float(pre([img], "a red apple").scores[0])
    assert with_prefix == pytest.approx(float(plain([img], "A photo depicts a red apple").scores[0]), abs=1e-6)
    assert with_prefix != pytest.approx(float(plain([img], "a red apple").scores[0]), abs=1e-4)


def test_pickscore_default_is_the_hub_id_the_readme_downloads():
    from rewardkit.rewards.pickscore import PickScoreConfig

    assert PickScoreConfig().model == "yuvalkirstain/PickScore_v1"
    assert "hf download yuvalkirstain/PickScore_v1" in INSTALL


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_calibrate_data_csv_parquet_relative_paths(tiny_clip_dir, tmp_path, fmt, capsys):
    """`rewardkit calibrate --data` takes JSONL or CSV / parquet, `image` relative to the file; the stats are
    those of the reward's scores on those images (population std)."""
    import json

    import numpy as np
    from PIL import Image

    from rewardkit import load_reward
    from rewardkit.cli import main

    rows = [json.loads(x) for x in (REPO / "examples" / "images" / "t2i.jsonl").read_text().splitlines()]
    (tmp_path / "data" / "imgs").mkdir(parents=True)
    for r in rows:
        shutil.copy(REPO / "examples" / "images" / r["image"], tmp_path / "data" / "imgs" / r["image"])
    table = {"prompt": [r["prompt"] for r in rows], "image": ["imgs/" + r["image"] for r in rows]}
    data = tmp_path / "data" / f"calib.{fmt}"
    if fmt == "csv":
        import csv

        with open(data, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prompt", "image"])
            w.writerows(zip(table["prompt"], table["image"]))
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table(table), data)
    out = tmp_path / "stats.json"
    # cosine: the default hessel clamps a random CLIP's negative cosines to 0 (all scores equal)
    assert main(["calibrate", "-r", "clipscore", "-m", str(tiny_clip_dir), "--data", str(data), "-o", str(out),
                 "--set", "convention=cosine", "--no-progress"]) == 0
    stats = json.loads(out.read_text())
    reward = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    want = np.array([float(reward([Image.open(REPO / "examples" / "images" / r["image"])], r["prompt"]).scores[0])
                     for r in rows], dtype=np.float64)
    assert stats["n"] == 3 and stats["n_invalid"] == 0 and want.std() > 1e-3
    assert stats["mean"] == pytest.approx(want.mean(), abs=1e-5)
    assert stats["std"] == pytest.approx(want.std(ddof=0), abs=1e-5)
    assert (stats["min"], stats["max"]) == (pytest.approx(want.min(), abs=1e-5), pytest.approx(want.max(), abs=1e-5))


def test_ls_says_when_an_extra_is_not_installed(monkeypatch, capsys):
    """`rewardkit ls` shows whether each reward's extras are installed (and the pip line for the missing)."""
    import json

    from rewardkit import _imports
    from rewardkit.cli import main

    monkeypatch.setattr(_imports, "extra_installed", lambda e: e != "ocr")
    assert main(["ls", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ocr"]["installed"] is False and rows["clipscore"]["installed"] is True
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    ocr_line = next(x for x in out.splitlines() if x.startswith("ocr "))
    assert re.search(r"\sno(\s|$)", ocr_line), ocr_line
    assert "pip install 'rewardkit-vision[ocr]'" in out


def test_commands_table_names_every_command():
    from rewardkit.cli import COMMANDS

    table = COMMANDS_PAGE[COMMANDS_PAGE.index("| command | what |"):].split("\n\n", 1)[0]
    named = set(re.findall(r"^\| `rewardkit (\w+)", table, re.M))
    assert named == set(COMMANDS), set(COMMANDS) ^ named


def test_default_outputs_are_git_ignored():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    paths = ["outputs/scores.jsonl", "runs/arena_tiny/model", "bench-results/x.json", ".rewardkit_cache/tiny-clip"]
    res = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    assert res.stdout.split() == paths


@needs_bash
@pytest.mark.skipif(shutil.which("tesseract") is None, reason="test.sh would install tesseract first")
def test_test_sh_passes_its_arguments_to_pytest(venv):
    env, log, tmp = venv
    res = _bash(f'bash {REPO}/scripts/test.sh -m "not slow" -x', env, tmp, FAKE_RK_RC="0")
    assert res.returncode == 0, res.stderr
    assert _lines(log)[-1] == "python -m pytest -q -m not slow -x"


def test_exit_3_still_writes_every_result(tiny_clip_dir, tmp_path, capsys):
    """Exit 3: some samples could not be scored; each reason is printed and written, results still written."""
    import json

    from rewardkit.cli import main

    ok = REPO / "examples" / "images" / "t2i_red_apple.png"
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    out = tmp_path / "o" / "scores.jsonl"
    assert main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), str(ok), str(bad), "-p", "an apple",
                 "-o", str(out), "--no-progress"]) == 3
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 2
    good, broken = sorted(recs, key=lambda r: "broken" in json.dumps(r))
    assert good["valid"] is True and isinstance(good["score"], float)
    assert broken["valid"] is False and broken["error"] and "broken.png" in json.dumps(broken)
    assert "broken.png" in capsys.readouterr().out


@needs_bash
def test_test_sh_installs_tesseract_through_apt_when_missing(tmp_path):
    """`bash scripts/test.sh` (installs tesseract-ocr and chromium through apt when missing):
    .ci/install-system-deps.sh against a PATH with a fake apt-get and neither."""
    script = REPO / ".ci" / "install-system-deps.sh"
    if not script.is_file():
        pytest.skip("no .ci/install-system-deps.sh")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "apt.log"
    (bin_ / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_ / "apt-get").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                                  f"case \"$*\" in *install*) for t in tesseract chromium; do printf '#!/bin/sh\\n'"
                                  f" > {bin_}/$t; {shutil.which('chmod')} +x {bin_}/$t; done;; esac\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    bash = shutil.which("bash")
    res = subprocess.run([bash, str(script)], env={"PATH": str(bin_)}, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("update") and "install" in calls[1] and "tesseract-ocr" in calls[1].split()
    assert "chromium" in calls[1].split()  # the browser tests of `rewardkit view`
    # present: nothing is installed
    log.write_text("")
    assert subprocess.run([bash, str(script)], env={"PATH": str(bin_)}, timeout=30).returncode == 0
    assert log.read_text() == ""


def test_python_and_vllm_pins_as_documented():
    """Python >= 3.10; the vllm extra resolves to vllm 0.33.x with transformers 5.20.x (README, GPU section)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert data["project"]["requires-python"] == ">=3.10" and "Python >= 3.10" in README
    vllm = data["project"]["optional-dependencies"]["vllm"]
    assert "vllm>=0.33,<0.34" in vllm and "transformers>=5.20,<5.21" in vllm
    assert "vllm 0.33.x brings torch 2.14.0 + transformers 5.20.x" in INSTALL
    # vllm 0.33 itself needs Python >= 3.11: the extras table and the GPU section say so
    assert "offline vLLM judge backend (Python >= 3.11" in INSTALL and "a CUDA GPU and Python >= 3.11" in INSTALL


def test_testing_kit_names_in_the_readme():
    """`rewardkit.testing`: tiny_qwen2_5_vl(), tiny_qwen3_vl(), tiny_clip() return (model, processor)."""
    from rewardkit import testing

    for name in ("tiny_qwen2_5_vl", "tiny_qwen3_vl", "tiny_clip", "tiny_sd3_pipeline", "save_tiny_checkpoint"):
        assert callable(getattr(testing, name)) and f"{name}(" in CONTRACT, name
    model, proc = testing.tiny_clip()
    assert type(model).__name__ == "CLIPModel" and hasattr(proc, "image_processor") and hasattr(proc, "tokenizer")


@pytest.mark.slow
def test_rewardkit_max_pixels_environment_variable():
    """README: the decompression-bomb limit is set with REWARDKIT_MAX_PIXELS (read at import), and
    set_max_pixels(None) restores that value, not PIL's."""
    code = ("import numpy as np\nfrom rewardkit import media\n"
            "print(media.get_max_pixels())\n"
            "media.load_image(np.zeros((10, 10, 3), np.uint8))\n"
            "media.set_max_pixels(5000); media.set_max_pixels(None); print(media.get_max_pixels())\n"
            "try:\n    media.load_image(np.zeros((11, 10, 3), np.uint8))\nexcept Exception as e:\n    print('refused', e)\n")
    env = dict(os.environ, REWARDKIT_MAX_PIXELS="100", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "100" and lines[1] == "100"
    assert lines[2].startswith("refused") and "100" in lines[2]


def _section(text: str, heading: str) -> str:
    return text[text.index(heading):].split("\n## ", 1)[0]


def test_readme_opens_with_what_the_two_commands_a_first_result_then_links():
    """Issue 40: what and why in a few lines, the commands (activating the environment among them), a first
    result with its picture, Python, then links; reference material lives on docs/ pages. No line over 120."""
    long = [i + 1 for i, line in enumerate(README.splitlines()) if len(line) > 120]
    assert not long, f"README lines over 120 characters: {long}"
    heads = re.findall(r"^## (.+)$", README, re.M)
    assert heads[:3] == ["Get started", "A first result", "In Python"], heads
    assert heads.index("Install as a package") < heads.index("Learn more")
    for gone in ("The contract", "Performance", "Security", "Layout", "Commands", "Rewards"):
        assert gone not in heads, gone  # moved to docs/
    assert README.index("## Get started") < 1200  # the first screen: a few lines of what and why, then commands
    start = _section(README, "## Get started")
    assert "bash scripts/score.sh" in start and "source .venv/bin/activate" in start and "rewardkit ls" in start
    pic = re.search(r"!\[[^\]]+\]\(([^)]+)\)", _section(README, "## A first result"))
    assert pic and (REPO / pic.group(1)).is_file()
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) > 10 and all((REPO / p).exists() for p in links), [p for p in links if not (REPO / p).exists()]
    for page in ("install.md", "contract.md", "rewards.md", "commands.md", "performance.md", "security.md",
                 "architecture.md"):
        assert f"(docs/{page}" in README, page


def test_the_hf_install_line_warns_about_cuda_torch_and_says_how_to_get_the_cpu_build():
    for text in (_section(README, "## Install as a package"), _section(INSTALL, "## Install as a package")):
        assert 'pip install "rewardkit-vision[hf]"' in text
        assert "CUDA build of" in text and "several GB" in text
        assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in text
    assert "download.pytorch.org/whl/cpu" in _section(README, "## Get started")  # before the first run


def test_readme_python_block_runs_and_shows_its_output(tiny_clip_dir, monkeypatch, capsys):
    """The README's "In Python" block, verbatim but for the tiny checkpoint's folder, run from the repository
    root: the values its comments show are what it returns."""
    code = _section(README, "## In Python").split("```python\n", 1)[1].split("```", 1)[0]
    assert code.count('".rewardkit_cache/tiny-clip"') == 1
    monkeypatch.chdir(REPO)
    ns: dict = {}
    exec(compile(code.replace(".rewardkit_cache/tiny-clip", str(tiny_clip_dir)), "README.md", "exec"), ns)
    out, pair = ns["out"], ns["pair"]
    shown = re.search(r"out\.scores\s+# tensor\(\[([^\]]+)\]\)", code).group(1).split(",")
    assert [round(float(v), 4) for v in out.scores[:2]] == [float(v) for v in shown[:2]]
    assert shown[2].strip() == "nan" and out.valid.tolist() == [True, True, False]
    assert out.errors[:2] == [None, None] and f"'{out.errors[2]}'" in code
    assert f"tensor([{float(pair.prob_a[0]):.4f}])" in code
