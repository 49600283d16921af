"""Every recipe a help text, docstring, README or docs page names exists (`rewardkit rl --help` named one that
did not)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
