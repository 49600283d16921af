"""No fast test asserts an upper bound on wall-clock time (issue 39): on a loaded machine such a test fails
without a bug, and on a quiet one it often passes with the bug. A fast test checks what the bug changes
(the call a spy sees, a count, the wait a backoff asks for, the error a deadline gives); a speed target is a
benchmark (benchmarks/README.md). Lower bounds (``>= 0.9`` s: "it waited") are allowed: load only lengthens.
Tests marked ``slow`` (the whole-suite run) are not scanned. The scan sees ``time.<clock>() - t`` and names
assigned from it inside the test, not durations returned by a helper."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
_CLOCKS = {"time", "monotonic", "perf_counter", "monotonic_ns", "perf_counter_ns"}
#: the text every clock call the scan sees holds (``time.<clock>``, any whitespace around the dot): a file
#: without it has nothing to find and is not parsed (most test files; the parse was most of this test's time)
_CLOCK_TEXT = re.compile(r"\btime\s*\.\s*(?:%s)\b" % "|".join(sorted(_CLOCKS)))


def _is_clock_call(node: ast.AST) -> bool:
    """``time.monotonic()`` / ``time.perf_counter()`` / ``time.time()``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CLOCKS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "time")


def _is_elapsed(node: ast.AST, elapsed_names: set[str]) -> bool:
    """``time.monotonic() - t0`` or a name assigned from one in the same test."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_clock_call(node.left):
        return True
    return isinstance(node, ast.Name) and node.id in elapsed_names


def _is_slow(marks: list[ast.expr]) -> bool:
    """``@pytest.mark.slow`` on the test itself (a parametrization with some slow cases still runs the others)."""
    return any(ast.unparse(m).split("(")[0] in ("pytest.mark.slow", "mark.slow") for m in marks)


def _module_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            if "slow" in ast.unparse(node.value):
                return True
    return False


def upper_bounds(source: str, filename: str = "<test>") -> list[str]:
    """``file:line test`` for each wall-clock upper bound asserted in a test function not marked slow."""
    if not _CLOCK_TEXT.search(source):
        return []
    tree = ast.parse(source, filename)
    if _module_slow(tree):
        return []
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.name.startswith("test"):
            continue
        if _is_slow(fn.decorator_list):
            continue
        elapsed_names = {t.id for node in ast.walk(fn) if isinstance(node, ast.Assign) and _is_elapsed(node.value, set())
                         for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assert):
                continue
            for cmp in ast.walk(node.test):
                if not isinstance(cmp, ast.Compare):
                    continue
                operands = [cmp.left, *cmp.comparators]
                for i, op in enumerate(cmp.ops):
                    left, right = operands[i], operands[i + 1]
                    if (isinstance(op, (ast.Lt, ast.LtE)) and _is_elapsed(left, elapsed_names)) or \
                            (isinstance(op, (ast.Gt, ast.GtE)) and _is_elapsed(right, elapsed_names)):
                        found.append(f"{filename}:{node.lineno} {fn.name}")
    return found


def test_the_scanner_finds_the_forms_it_forbids_and_allows_the_rest():
    bad = """
import time
def test_a():
    t = time.monotonic()
    assert time.monotonic() - t < 2.0
def test_b():
    t0 = time.perf_counter()
    elapsed = time.perf_counter() - t0
    assert ok and 15 > elapsed
"""
    assert upper_bounds(bad) == ["<test>:5 test_a", "<test>:9 test_b"]
    spaced = bad.replace("time.monotonic()", "time . monotonic()").replace("time.perf_counter()",
                                                                         "time.\\\n  perf_counter()")
    assert upper_bounds(spaced) == ["<test>:5 test_a", "<test>:11 test_b"]  # (the text filter lets them through)
    fine = """
import time, pytest
def test_lower_bound():
    t = time.monotonic()
    assert time.monotonic() - t >= 0.9
@pytest.mark.slow
def test_slow():
    t = time.monotonic()
    assert time.monotonic() - t < 2.0
def helper():
    t = time.monotonic()
    assert time.monotonic() - t < 2.0
"""
    assert upper_bounds(fine) == []
    assert upper_bounds("import time, pytest\npytestmark = pytest.mark.slow\n" + bad) == []


def test_no_fast_test_asserts_a_wall_clock_upper_bound():
    found = [hit for path in sorted(TESTS.rglob("test_*.py"))
             for hit in upper_bounds(path.read_text(encoding="utf-8"), str(path.relative_to(TESTS)))]
    assert found == [], "wall-clock upper bounds in fast tests (check what the bug changes instead):\n" + \
        "\n".join(found)
