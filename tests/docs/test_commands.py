"""Docs a user can follow: every command line in README.md and docs/*.md is either run here, verbatim, with
tiny checkpoints at the paths the docs use, or marked in the doc itself as needing real weights / a GPU /
the network (an in-line `# needs ...` comment, or a `# ... needs ...` comment line above it in its block).
Also: `rewardkit ls` agrees with the README's reward table and fits 100 columns; --help has no RST markup;
every repository path the docs name exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_CMD = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:rewardkit|bash|python3?|torchrun|hf|pip|accelerate|vllm|huggingface-cli)\s")
_NEEDS = re.compile(r"#.*\bneeds?\b")
# run by other tests (they take minutes or are the suite itself)
ELSEWHERE = {
    "bash scripts/score.sh": "tests/cli/test_score_script.py::test_demo_without_arguments_shows_t2i_edit_and_compare",
    "bash scripts/test.sh": "the test suite itself",
    "bash scripts/docs.sh build": ".ci/run (strict site build); tests/docs/test_site.py",
    "bash scripts/docs.sh serve": "a live server: the same build as `build`, served",
    "bash scripts/lint-imports.sh": ".ci/run; tests/project/test_architecture.py::test_the_import_contracts_hold",
    "python -m pytest tests/project/test_architecture.py": "the test suite itself",
}


def doc_commands() -> list[tuple[str, int, str, bool]]:
    """(doc, line, command, marked) for every command line in a shell code block (continuations joined)."""
    out = []
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        i, lang, block_marked = 0, None, False
        while i < len(lines):
            line = lines[i]
            if line.startswith("```"):
                lang = None if lang is not None else line[3:].strip()
                block_marked = False
                i += 1
                continue
            if lang in ("bash", "sh", "shell", "console", ""):
                start = i
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                text = line.strip()
                if text.startswith("#"):
                    block_marked = block_marked or bool(_NEEDS.search(text))
                elif _CMD.match(text):
                    out.append((doc.name, start + 1, text, block_marked or bool(_NEEDS.search(text))))
            i += 1
    return out


def _command(text: str) -> str:
    return re.sub(r"\s+#.*$", "", text).strip()


def test_every_doc_command_is_run_or_marked():
    cmds = doc_commands()
    assert len(cmds) > 20
    unmarked = [(d, n, c) for d, n, c, marked in cmds if not marked]
    assert unmarked  # the runnable ones exist and are run below
    for d, n, c in unmarked:
        assert "<" not in _command(c) and "..." not in _command(c), f"{d}:{n}: placeholder in a runnable line: {c}"


def _runnable():
    return [(d, n, _command(c)) for d, n, c, marked in doc_commands() if not marked and _command(c) not in ELSEWHERE]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, tiny_clip_dir):
    """A folder laid out like the repository root after `bash scripts/score.sh`: examples/, recipes/, scripts/
    and .rewardkit_cache/ with the tiny demo checkpoints."""
    import torch

    from rewardkit.models.preference import PreferenceModel

    root = tmp_path_factory.mktemp("docs-sandbox")
    for name in ("examples", "recipes", "scripts", "pyproject.toml"):
        (root / name).symlink_to(REPO / name)
    cache = root / ".rewardkit_cache"
    shutil.copytree(tiny_clip_dir, cache / "tiny-clip")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        PreferenceModel.from_backbone("tiny:qwen2_5_vl").save_pretrained(cache / "tiny-preference")
    return root


def _run_in_process(cmd: str, cwd: Path) -> int:
    """A `rewardkit ...` line through the console script's own entry point, in this process (one import of
    torch / transformers for all of them); globs are expanded as the shell would."""
    import glob
    import shlex

    from rewardkit.cli import main

    argv = []
    for tok in shlex.split(cmd)[1:]:
        hits = sorted(glob.glob(tok, root_dir=cwd)) if any(ch in tok for ch in "*?[") else []
        argv += hits or [tok]
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _run_example(cmd: str, monkeypatch) -> int:
    """`python examples/X.py ARGS` as `runpy` runs it: the script's `__main__` block, its argv, this process."""
    import runpy
    import shlex

    argv = shlex.split(cmd)[1:]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        runpy.run_path(str(REPO / argv[0]), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


@pytest.mark.slow
def test_run_every_unmarked_doc_command(sandbox, monkeypatch):
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               REWARDKIT_VENV=sys.prefix, REWARDKIT_SKIP_INSTALL="1", REWARDKIT_DEMO_CACHE=str(sandbox / ".rewardkit_cache"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    monkeypatch.setenv("REWARDKIT_CACHE", str(sandbox / "cache"))
    monkeypatch.chdir(sandbox)
    cmds = _runnable()
    # training first: later lines read what it writes (runs/arena_tiny/model)
    order = [d.name for d in DOCS]
    cmds.sort(key=lambda t: (" train " not in f" {t[2]} ", order.index(t[0])))
    ran, two_process_rl = [], []
    for doc, line, cmd in cmds:
        if cmd in ran:  # the same line in two places (rl.md's two-process run): it ran, and passed, once
            continue
        if "--reward ocr" in cmd and shutil.which("tesseract") is None:
            continue
        if cmd.startswith("rewardkit "):
            rc, detail = _run_in_process(cmd, sandbox), ""
        elif cmd.startswith("python examples/"):  # the examples: in this process too (torch imported once)
            rc, detail = _run_example(cmd, monkeypatch), ""
        elif cmd.startswith("bash scripts/"):  # a real shell and script, each `rewardkit` line it runs a process
            # forked from this one (tests/helpers/forked.py::run_script: no fresh Python importing torch per line)
            from tests.helpers.forked import run_script

            res = run_script(cmd, sandbox, env, timeout=600)
            rc, detail = res.returncode, res.stdout[-2000:] + res.stderr[-3000:]
        else:  # torchrun: a real launch, as a user runs it
            res = subprocess.run(["bash", "-c", cmd], cwd=sandbox, env=env, capture_output=True, text=True,
                                 timeout=600)
            rc, detail = res.returncode, res.stdout[-2000:] + res.stderr[-3000:]
        assert rc == 0, f"{doc}:{line}: `{cmd}` exited {rc}\n{detail}"
        if cmd.startswith("torchrun ") and " rl nft " in f" {cmd} ":
            two_process_rl.append(_check_two_process_rl_run(cmd, res.stdout))
        ran.append(cmd)
    assert any(c.startswith("rewardkit train preference") for c in ran)
    assert (sandbox / "outputs" / "scores.jsonl").is_file() and (sandbox / "runs" / "arena_tiny" / "model").is_dir()
    assert (sandbox / "rewards.png").is_file() and (sandbox / "outputs" / "pickscore-calibration.json").is_file()
    # docs/view.md's two-reward page compares two rewards that tell the images apart (the default Hessel scale
    # gave the tiny CLIP 0 for every image: a degenerate demo)
    import json

    clip = [json.loads(x)["score"] for x in (sandbox / "outputs" / "t2i_clipscore.jsonl").read_text().splitlines()]
    assert len(clip) == 3 and len(set(clip)) == 3, clip
    _check_tiny_examples(sandbox, ran)
    assert two_process_rl, "docs/rl.md's 2-process torchrun line was not run"


def _check_two_process_rl_run(cmd: str, stdout: str) -> dict:
    """docs/rl.md's `torchrun --nproc_per_node 2 ... rl nft --config recipes/nft/tiny.yaml`: 2 gloo processes whose
    LoRA replicas end identical, every epoch of the recipe trained (formerly its own 2-process run in
    rl/test_trainer.py::test_two_process_gloo_run_keeps_replicas_identical: one launch now checks both)."""
    import json
    import shlex

    import yaml

    toks = shlex.split(cmd)
    recipe = yaml.safe_load((REPO / toks[toks.index("--config") + 1]).read_text())
    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])
    assert summary["world_size"] == 2 and summary["replicas_in_sync"] is True, summary
    assert summary["global_step"] == recipe["num_epochs"] * recipe["train"]["steps_per_epoch"], summary
    return summary


def _check_tiny_examples(root: Path, ran: list[str]) -> None:
    """docs/commands.md's runnable examples did what the page says (issue 40, item 5)."""
    import json

    pq = pytest.importorskip("pyarrow.parquet")
    assert any(c.startswith("python examples/serve_tiny.py") for c in ran)
    data = pq.read_table(root / "outputs" / "best_of_3.parquet").to_pylist()
    assert len(data) == 9 and len({r["prompt"] for r in data}) == 3
    scores = pq.read_table(root / "outputs" / "best_of_3_scores").to_pylist()
    assert sorted(r["id"] for r in scores) == sorted(r["id"] for r in data) and all(r["valid"] for r in scores)
    by_id = {r["id"]: r["score"] for r in scores}
    best = {}
    for r in data:  # the best candidate of each prompt, by hand
        if r["prompt"] not in best or by_id[r["id"]] > by_id[best[r["prompt"]]]:
            best[r["prompt"]] = r["id"]
    kept = pq.read_table(root / "outputs" / "best_of_3_kept").to_pylist()
    assert sorted(r["id"] for r in kept) == sorted(best.values())
    above = pq.read_table(root / "outputs" / "best_of_3_above").to_pylist()
    assert sorted(r["id"] for r in above) == sorted(i for i, v in by_id.items() if v > -2) and 0 < len(above) < 9
    page = (root / "outputs" / "best_of_3.html").read_text(encoding="utf-8")
    import re

    view = json.loads(re.search(r'<script type="application/json" id="rk-data">(.*?)</script>', page, re.S).group(1))
    (sec,) = view["sections"]
    assert len(sec["rows"]) == 9 and all(r["img"] and r["prompt"] for r in sec["rows"])  # joined to the dataset
    recs = [json.loads(x) for x in (root / "outputs" / "refine" / "records.jsonl").read_text().splitlines()]
    assert [r["status"] for r in recs] == ["refined", "refined"]
    assert all(r["score_after"] > r["score_before"] for r in recs)
    assert (root / "outputs" / "refine" / "after" / "00001.png").is_file()


def _output_paths() -> list[tuple[str, int, str]]:
    """Every relative `-o` / `--output` / `output_dir=` path of a documented command line."""
    import shlex

    out = []
    for doc, line, cmd, _marked in doc_commands():
        try:
            toks = shlex.split(_command(cmd))
        except ValueError:
            continue
        for i, tok in enumerate(toks):
            if tok in ("-o", "--output") and i + 1 < len(toks):
                out.append((doc, line, toks[i + 1]))
            elif tok.startswith(("output_dir=", "--output=")):
                out.append((doc, line, tok.split("=", 1)[1]))
    return [(d, n, p) for d, n, p in out if not p.startswith(("/", "~", "$"))]


def test_what_documented_commands_write_is_git_ignored():
    """Following the docs from a clone leaves `git status` clean: each output they write is git-ignored."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    paths = _output_paths()
    assert len(paths) > 10
    res = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, capture_output=True, text=True,
                         input="\n".join(p for _d, _n, p in paths) + "\n")
    ignored = set(res.stdout.split())
    missing = [f"{d}:{n}: {p}" for d, n, p in paths if p not in ignored]
    assert not missing, missing


def _readme_table() -> list[dict[str, str]]:
    text = (REPO / "docs" / "rewards.md").read_text(encoding="utf-8")
    lines = text[text.index("| reward (aliases) |"):].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append(dict(zip(header, cells)))
    return rows


def test_ls_agrees_with_readme_table_and_fits_100_columns(capsys):
    from rewardkit.cli import main
    from rewardkit.commands.ls import describe_rewards, table_rows

    readme = {}
    for r in _readme_table():
        names = re.findall(r"`([^`]+)`", r["reward (aliases)"])
        readme[names[0]] = {"aliases": names[1:], "tasks": r["tasks"].replace(" ", ""), "range": r["range"],
                            "extras": r["extras"]}
    rows = describe_rewards()
    ours = {r["name"]: r for r in rows}
    assert set(readme) == set(ours)
    for (name, tasks, rng, extras, _grad, _inst, _what), r in zip(table_rows(rows), rows):
        want = readme[r["name"]]
        assert r["aliases"] == want["aliases"], name
        assert (tasks, rng, extras) == (want["tasks"], want["range"], want["extras"]), name
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "``" not in out


def test_help_texts_have_no_rst_markup(capsys):
    from rewardkit.cli import COMMANDS, main

    cmds = [[]] + [[c] for c in COMMANDS] + [["train", "preference"], ["compose", "score"], ["compose", "prepare"]]
    for cmd in cmds:
        with pytest.raises(SystemExit):
            main(cmd + ["--help"])
        out = capsys.readouterr().out
        for bad in ("``", ":func:", ":class:", ":meth:", "(other issues add", "TODO"):
            assert bad not in out, (cmd, bad)
        assert not re.search(r"^\s*\.\. \w", out, re.M), cmd  # RST directives
        if cmd and cmd[0] in ("score", "compare", "bench", "calibrate", "compose", "train", "soup"):
            assert "exit codes: 0" in out.replace("\n", " "), cmd


def test_repository_paths_named_in_docs_exist():
    tops = ("rewardkit/", "recipes/", "docs/", "examples/", "scripts/", "tests/", "benchmarks/", ".ci/")
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert "../shared" not in text and "huggingface-cli download" not in text, doc.name
        for m in re.finditer(r"[`(\[]((?:%s)[\w./*-]*)" % "|".join(re.escape(t) for t in tops), text):
            path = m.group(1).rstrip(".")
            if "*" in path:
                if not list(REPO.glob(path)):
                    missing.append(f"{doc.name}: {path}")
            elif not (REPO / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, missing
