"""The mutation table of benchmarks/README.md against the records scripts/mutation.sh wrote beside it
(benchmarks/mutation/*.json): every record parses and adds up, and every row's commit, seed, sample and score
are those of its record, so a row can be reproduced with the command the README gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
RECORDS = ROOT / "benchmarks" / "mutation"
KILLED = {"killed", "timeout", "caught by type check", "segfault"}   # what mutation.sh counts as killed
SURVIVED = {"survived", "no tests"}

pytestmark = pytest.mark.skipif(not RECORDS.is_dir(), reason="no benchmarks/mutation/ in this checkout")


def _records():
    return sorted(RECORDS.glob("*.json"))


def _table_rows():
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    section = text.split("## `scripts/mutation.sh`", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|") and "](mutation/" in line]


@pytest.mark.parametrize("path", _records(), ids=lambda p: p.name)
def test_each_record_parses_and_adds_up(path):
    r = json.loads(path.read_text(encoding="utf-8"))
    for key in ("module", "files", "tests", "commit", "seed", "sample", "killed", "survived", "unchecked", "score",
                "mutants"):
        assert key in r, f"{path.name}: no {key!r}"
    statuses = list(r["mutants"].values())
    assert r["killed"] == sum(s in KILLED for s in statuses)
    assert r["survived"] == sum(s in SURVIVED for s in statuses)
    assert r["unchecked"] == len(statuses) - r["killed"] - r["survived"]
    if r["sample"]:
        assert len(statuses) <= r["sample"]
    total = r["killed"] + r["survived"]
    assert total and r["score"] == round(100.0 * r["killed"] / total, 2)
    assert path.name == f"{r['module']}-{r['commit'][:12]}-seed{r['seed']}-n{r['sample']}.json"


def test_the_readme_rows_are_their_records():
    rows = _table_rows()
    seen = set()
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = re.search(r"\]\(mutation/([^)]+\.json)\)", cells[-1]).group(1)   # the record column
        r = json.loads((RECORDS / name).read_text(encoding="utf-8"))
        assert "+dirty" not in r["commit"], f"{name}: recorded on a tree with uncommitted changes"
        sha = re.search(r"`([0-9a-f]{7,40})`", cells[1]).group(1)
        assert r["commit"].startswith(sha), (name, sha)
        assert cells[2] == str(r["seed"]), (name, cells[2])
        assert re.match(rf"{len(r['mutants'])} of \d+", cells[3]), (name, cells[3])
        m = re.search(r"([\d.]+)%\**\s*\((\d+)/(\d+)\)", cells[4])
        assert m, (name, cells[4])
        assert (int(m.group(2)), int(m.group(3))) == (r["killed"], r["killed"] + r["survived"]), name
        assert float(m.group(1)) == round(r["score"], 1), name
        assert r["unchecked"] == 0, f"{name}: the run stopped before testing every sampled mutant"
        seen.add(r["module"])
    assert len(seen) == len(rows), "two rows for one module"
    assert {"parsers", "integrations", "nft", "exploration", "server", "parrot_format"} <= seen
