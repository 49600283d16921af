"""The claim -> test map (tests/README.md) names only files and tests that exist: every `folder/test_file.py`,
`folder/test_file.py::name` and `::name` (the file of the reference before it on the same line) resolves to a file
under tests/ that defines `name` (a trailing `*` or `_` is a prefix, `*_name` a suffix)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
README = TESTS / "README.md"
_REF = re.compile(r"(?:tests/)?((?:[a-z_]+/)+test_\w+\.py)?::([\w*]+)|(?:tests/)?((?:[a-z_]+/)+test_\w+\.py)(?!::)")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", re.M)


def references(text: str) -> list[tuple[int, str, str | None]]:
    """(line, file relative to tests/, name or None) for every reference inside backticks."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        current = None
        for span in re.findall(r"`([^`]*)`", line):
            for m in _REF.finditer(span):
                file, name, bare = m.groups()
                if bare:
                    out.append((n, bare, None))
                    continue
                current = file or current
                out.append((n, current, name))
    return out


def _defined(path: Path, name: str) -> bool:
    names = _DEF.findall(path.read_text(encoding="utf-8"))
    if "*" in name:
        return any(fnmatch.fnmatchcase(x, name) for x in names)
    if name.endswith("_"):
        return any(x.startswith(name) for x in names)
    return name in names


def test_every_file_and_test_in_the_claim_map_exists():
    refs = references(README.read_text(encoding="utf-8"))
    assert len(refs) > 300  # the map is parsed (a broken pattern would find nothing and pass)
    missing = []
    for line, file, name in refs:
        path = TESTS / file if file else None
        if path is None or not path.is_file():
            missing.append(f"line {line}: {file}::{name} (no such file)")
        elif name is not None and not _defined(path, name):
            missing.append(f"line {line}: {file}::{name} (not defined there)")
    assert not missing, "\n".join(missing)


def test_references_resolve_continuations_and_patterns(tmp_path):
    text = "| a | `serve/test_server.py::test_a`, `::test_b`, `docs/test_site.py` |\n| b | `::orphan` |\n"
    assert references(text) == [(1, "serve/test_server.py", "test_a"), (1, "serve/test_server.py", "test_b"),
                                (1, "docs/test_site.py", None), (2, None, "orphan")]
    f = tmp_path / "test_x.py"
    f.write_text("def test_zscore_basic():\n    pass\n\nclass Helper:\n    def inner(self):\n        pass\n")
    assert _defined(f, "test_zscore_") and _defined(f, "test_zscore_*") and _defined(f, "*_basic")
    assert _defined(f, "Helper") and _defined(f, "inner")
    assert not _defined(f, "test_zscore") and not _defined(f, "test_missing")
