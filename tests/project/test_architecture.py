"""The layers of docs/architecture.md hold: import-linter's contracts (`.importlinter`) run on the package, and
they are not vacuous (every top-level module sits in a layer; a planted upward import breaks them). No two
modules import each other, directly or through others (no import cycle).

CI runs the same contracts with ``bash scripts/lint-imports.sh`` before the tests; this file shows a broken
contract in pytest too. The cycle check is here, not in `.importlinter`: import-linter's ``acyclic_siblings``
contract counts a cycle between packages as a whole (``compose`` <-> ``rewards``, because ``compose`` sits on two
layers), not only between modules.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"
LINT = ("import sys; from importlinter.cli import lint_imports_command; "
        "sys.argv[0] = 'lint-imports'; sys.exit(lint_imports_command())")


def _lint(root: Path, **env_vars: str) -> subprocess.CompletedProcess:
    """``lint-imports`` on the ``rewardkit`` package under ``root`` (its ``.importlinter``), without a cache.
    import-linter is in the dev extra: without it this fails (ModuleNotFoundError in the output)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(env_vars, PYTHONPATH=str(root))
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


#: (module, planted line, the module it imports, the contract it must break)
PLANTS = [
    # the contract importing an implementation (what reward.py did with judges.policy.join_reasons)
    ("reward.py", "from .judges.policy import join_reasons as _j", "rewardkit.judges.policy",
     "The contract imports no implementation"),
    # preprocess importing the Reward module back (the cycle the split removed)
    ("preprocess.py", "from . import reward as _r", "rewardkit.reward",
     "preprocess never imports the Reward class's module"),
    # a reward importing a consumer
    ("rewards/clipscore.py", "from ..bench import metrics as _m", "rewardkit.bench.metrics", "Layers"),
    # the dataset engines importing the glue folder back (what datasets/parrot.py did with integrations.ray)
    ("datasets/parrot.py", "from ..integrations import ray as _r", "rewardkit.integrations.ray", "Layers"),
    # one consumer importing another
    ("rl/nft.py", "from ..bench import metrics as _m", "rewardkit.bench.metrics",
     "The consumers do not import each other"),
    # import rewardkit pulling torch
    ("__init__.py", "import torch as _t", "torch", "import rewardkit stays light"),
    # the serve folder loading a reward by name (what rewardkit.server's load_replicas does, above it)
    ("serve/server.py", "from ..registry import load_reward as _l", "rewardkit.registry",
     "The serve folder knows the contract"),
    # the binary body importing the JSON body back (the circle the move to serve/checks.py removed)
    ("serve/binary.py", "from . import wire as _w", "rewardkit.serve.wire", "The serve folder's own layers"),
]


@pytest.fixture(scope="module")
def planted_lint(tmp_path_factory) -> tuple[dict[str, str], dict[str, int]]:
    """One lint run on one copy of the package holding every plant of :data:`PLANTS`: ``({contract heading:
    its report}, {module: the planted line's number})``. One run instead of one per plant (a copy of the
    package and an import-linter process each, ~0.5 s): whether a direct import breaks a layers, forbidden or
    independence contract depends only on the two modules, never on the other imports, so each plant's own
    line in its contract's report (checked below) is what a run with that plant alone would report."""
    root = tmp_path_factory.mktemp("planted")
    shutil.copytree(ROOT / "rewardkit", root / "rewardkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CONFIG, root / ".importlinter")
    lines = {}
    for module, line, _, _ in PLANTS:
        target = root / "rewardkit" / module
        text = target.read_text(encoding="utf-8")
        head, sep, rest = text.partition("from __future__ import annotations\n")
        assert sep, module
        target.write_text(head + sep + line + "\n" + rest, encoding="utf-8")
        lines[module] = (head + sep).count("\n") + 1
    res = _lint(root, COLUMNS="1000")  # (one heading per line)
    assert res.returncode != 0, res.stdout
    broken = res.stdout.split("Broken contracts", 1)[-1]
    heads = [(m.start(), m.end(), m.group(1)) for m in re.finditer(r"^(\S.*)\n(-+)$", broken, re.M)
             if len(m.group(2)) == len(m.group(1))]
    reports = {h: broken[e:(heads[i + 1][0] if i + 1 < len(heads) else len(broken))]
               for i, (_, e, h) in enumerate(heads)}
    return reports, lines


@pytest.mark.parametrize("module, line, imported, broken", PLANTS, ids=[f"{p[0]}-{p[1]}-{p[3]}" for p in PLANTS])
def test_a_planted_upward_import_breaks_a_contract(planted_lint, module, line, imported, broken):
    """Non-vacuity: each contract is broken by one planted import, which its report names as a direct illegal
    import (``- importer -> imported (l.N)`` alone, not as a link of another plant's chain)."""
    reports, lines = planted_lint
    found = [text for head, text in reports.items() if head.startswith(broken)]
    assert len(found) == 1, f"{broken!r} not among the broken contracts: {sorted(reports)}"
    importer = "rewardkit" + ("" if module == "__init__.py" else "." + module[:-3].replace("/", "."))
    direct = rf"^-\s+{re.escape(importer)} -> {re.escape(imported)} \(l\.{lines[module]}\)\n\n"
    assert re.search(direct, found[0], re.M), found[0]


# ------------------------------------------------------------------------------------------------ import cycles
# Cycles left in place, each with its reason. An entry that matches no cycle any more fails the check: remove it.
ALLOWED_CYCLES: set[frozenset[str]] = set()

# grimp's graph of the package, the one import-linter checks the contracts on: an import under `if TYPE_CHECKING:`
# is no edge (annotations only); an import inside a function is one (it defers loading, not the dependency: the
# two modules still need each other, and the layer contracts count it too). A cycle = the modules that reach each
# other through imports; printed with the imports that close it (importer, imported, line numbers).
CYCLES = """
import json, grimp
g = grimp.build_graph("rewardkit", exclude_type_checking_imports=True, cache_dir=None)
found = {}
for m in g.modules:
    on = g.find_upstream_modules(m) & g.find_downstream_modules(m)
    if on:
        ring = sorted(on | {m})
        found[" ".join(ring)] = [[a, b, [d["line_number"] for d in g.get_import_details(importer=a, imported=b)]]
                                 for a in ring for b in sorted(g.find_modules_directly_imported_by(a)) if b in ring]
print(json.dumps(found))
"""


def _cycles(root: Path) -> dict[frozenset[str], list]:
    """The import cycles between the modules of the ``rewardkit`` package under ``root``: each as its set of
    modules, with the imports between them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    res = subprocess.run([sys.executable, "-c", CYCLES], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return {frozenset(k.split()): v for k, v in json.loads(res.stdout).items()}


def test_no_import_cycle_between_modules():
    """Every import runs one way: no module imports one that imports it back, directly or through others (imports
    inside functions count, ``if TYPE_CHECKING:`` ones do not), except the cycles listed in ``ALLOWED_CYCLES``."""
    found = _cycles(ROOT)
    new = {k: v for k, v in found.items() if k not in ALLOWED_CYCLES}
    assert not new, "import cycles (importer, imported, lines):\n" + "\n".join(
        f"{sorted(k)}: {v}" for k, v in new.items())
    stale = ALLOWED_CYCLES - set(found)
    assert not stale, f"ALLOWED_CYCLES lists cycles that are gone: {sorted(map(sorted, stale))}; remove them"


def test_a_planted_cycle_breaks_the_cycle_check(tmp_path):
    """Non-vacuity, and what counts as an import: a module-level import and an import inside a function each close
    a cycle; an import under ``if TYPE_CHECKING:`` closes none (the evaluation -> trainer annotation that was
    removed for issue 39 would still be allowed)."""
    shutil.copytree(ROOT / "rewardkit", tmp_path / "rewardkit", ignore=shutil.ignore_patterns("__pycache__"))
    plants = {
        "media.py": "from . import reward as _planted\n",  # reward.py imports media at module level
        "judges/_transformers_types.py": "def _planted():\n    from . import transformers_backend\n",
        "rl/evaluation.py": "if TYPE_CHECKING:\n    from .trainer import NFTTrainer\n",  # the trainer imports it
    }
    for module, code in plants.items():
        target = tmp_path / "rewardkit" / module
        target.write_text(target.read_text(encoding="utf-8") + "\n\n" + code, encoding="utf-8")
    found = set(_cycles(tmp_path)) - ALLOWED_CYCLES
    assert any({"rewardkit.media", "rewardkit.reward"} <= c for c in found), found
    assert any({"rewardkit.judges._transformers_types", "rewardkit.judges.transformers_backend"} <= c
               for c in found), found
    assert not any("rewardkit.rl.trainer" in c for c in found), found
