"""Every recipe a help text, docstring, README or docs page names exists (`rewardkit rl --help` named one that
did not)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = re.compile(r"recipes/[A-Za-z0-9_./-]+?\.ya?ml")


def test_named_recipes_exist():
    sources = [*(ROOT / "rewardkit").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "recipes").rglob("*.yaml"), *(ROOT / "recipes").rglob("*.md")]
    missing = sorted({f"{src.relative_to(ROOT)}: {m}" for src in sources
                      for m in RECIPE.findall(src.read_text(encoding="utf-8"))
                      if "NAME" not in m and not (ROOT / m).is_file()})
    assert missing == []


def test_rl_help_names_existing_recipes(capsys):
    import pytest

    from rewardkit.cli import main

    with pytest.raises(SystemExit):
        main(["rl", "nft", "--help"])
    named = RECIPE.findall(capsys.readouterr().out)
    assert named and all((ROOT / m).is_file() for m in named if "NAME" not in m), named


def test_documented_single_and_multi_process_runs_use_separate_output_dirs():
    """The documented tiny NFT commands (docs/rl.md, README, the recipes' launch lines): a torchrun command never
    writes to the folder of a single-process one (it would try to resume a 1-process checkpoint under 2
    processes and fail). The output_dir is the command's ``output_dir=`` override, else the recipe's."""
    import yaml

    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "recipes").rglob("*.yaml")]
    texts = [p.read_text(encoding="utf-8") for p in files]
    command = re.compile(r"(?:^|\n)[#\s]*((?:torchrun|rewardkit|python)[^\n]*\brl nft\b(?:[^\n]*\\\n)*[^\n]*)")
    cmds = [re.sub(r"\\\n\s*", " ", m) for t in texts for m in command.findall(t)]
    dirs: dict[str, set[str]] = {"single": set(), "multi": set()}
    for c in cmds:
        m = re.search(r"--config (recipes/\S*tiny\S*\.yaml)", c)  # the CPU ones, run one after the other
        if not m or "--print-config" in c:
            continue
        over = re.search(r"\boutput_dir=(\S+)", c)
        out = over.group(1) if over else yaml.safe_load((ROOT / m.group(1)).read_text())["output_dir"]
        dirs["multi" if c.lstrip().startswith("torchrun") else "single"].add(out)
    assert dirs["multi"] and dirs["single"], cmds
    assert not dirs["multi"] & dirs["single"], dirs
