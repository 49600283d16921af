"""The layers of docs/architecture.md hold: import-linter's contracts (`.importlinter`) run on the package, and
they are not vacuous (every top-level module sits in a layer; a planted upward import breaks them).

CI runs the same contracts with ``bash scripts/lint-imports.sh`` before the tests; this file shows a broken
contract in pytest too.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"
LINT = ("import sys; from importlinter.cli import lint_imports_command; "
        "sys.argv[0] = 'lint-imports'; sys.exit(lint_imports_command())")


def _lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the ``rewardkit`` package under ``root`` (its ``.importlinter``), without a cache.
    import-linter is in the dev extra: without it this fails (ModuleNotFoundError in the output)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo", str(root / ".importlinter")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _layer_modules() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(CONFIG)
    names = set()
    for line in cfg["importlinter:contract:layers"]["layers"].split("\n"):
        for part in line.replace("|", ":").split(":"):
            if part.strip():
                names.add(part.strip().strip("()"))
    return names


def test_the_import_contracts_hold():
    """Every contract of .importlinter is kept: the layers (commands > consumers > datasets > composite > registry
    > rewards > judges > models > the contract), the consumers' independence, the contract importing no
    implementation, preprocess below reward, and a light ``import rewardkit``."""
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout and "broken" not in res.stdout.replace("0 broken", "")


def test_every_top_level_module_is_in_a_layer():
    """A new module or folder under rewardkit/ must be placed in a layer (docs/architecture.md says where), or
    its imports would go unchecked."""
    placed = _layer_modules()
    pkg = ROOT / "rewardkit"
    found = {f"rewardkit.{p.stem}" for p in pkg.glob("*.py") if p.stem != "__init__"}
    found |= {f"rewardkit.{p.name}" for p in pkg.iterdir() if (p / "__init__.py").is_file()}
    # compose is placed by its modules: the composite above the rewards, the rubric machinery below them
    found = {m for m in found if m != "rewardkit.compose"} | {
        f"rewardkit.compose.{p.stem}" for p in (pkg / "compose").glob("*.py") if p.stem != "__init__"}
    assert found - placed == set(), f"modules in no layer of .importlinter: {sorted(found - placed)}"


@pytest.mark.parametrize("module, line, broken", [
    # the contract importing an implementation (what reward.py did with judges.policy.join_reasons)
    ("reward.py", "from .judges.policy import join_reasons as _j", "The contract imports no implementation"),
    # preprocess importing the Reward module back (the cycle the split removed)
    ("preprocess.py", "from . import reward as _r", "preprocess never imports the Reward class's module"),
    # a reward importing a consumer
    ("rewards/clipscore.py", "from ..bench import metrics as _m", "Layers"),
    # the dataset engines importing the glue folder back (what datasets/parrot.py did with integrations.ray)
    ("datasets/parrot.py", "from ..integrations import ray as _r", "Layers"),
    # one consumer importing another
    ("rl/nft.py", "from ..bench import metrics as _m", "The consumers do not import each other"),
    # import rewardkit pulling torch
    ("__init__.py", "import torch as _t", "import rewardkit stays light"),
])
def test_a_planted_upward_import_breaks_a_contract(tmp_path, module, line, broken):
    """Non-vacuity: each contract fails on a copy of the package with one planted import."""
    shutil.copytree(ROOT / "rewardkit", tmp_path / "rewardkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CONFIG, tmp_path / ".importlinter")
    target = tmp_path / "rewardkit" / module
    text = target.read_text(encoding="utf-8")
    head, sep, rest = text.partition("from __future__ import annotations\n")
    target.write_text(head + sep + line + "\n" + rest, encoding="utf-8")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout
    broken_section = res.stdout.split("Broken contracts", 1)[-1]
    assert broken in broken_section, res.stdout
