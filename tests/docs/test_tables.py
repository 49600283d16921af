"""Markdown tables in the README and docs/ render as one table each: no blank line splits a table (the rows after
it would render as a stray paragraph of pipes), and a table ends at a blank line (a text line right after a
table renders as one more row)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def table_problems(text: str) -> list[str]:
    lines = text.splitlines()
    problems, in_code, in_table = [], False, False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            in_table = False
            continue
        row = line.startswith("|")
        if row and i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-: ") \
                and lines[i + 1].startswith("|") and not in_table:
            in_table = True
            continue
        if in_table and not row:
            if line.strip():
                problems.append(f"line {i + 1}: text right after a table (renders as a row): {line[:60]!r}")
            elif i + 1 < len(lines) and lines[i + 1].startswith("|") and not (
                    i + 2 < len(lines) and set(lines[i + 2].replace("|", "").strip()) <= set("-: ")
                    and lines[i + 2].startswith("|")):
                problems.append(f"line {i + 1}: a blank line inside a table (the rows after it do not render)")
            in_table = False
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_tables_are_whole(page):
    assert table_problems(page.read_text(encoding="utf-8")) == []


def test_the_check_sees_a_split_table():
    head = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert table_problems(head + "\n| 3 | 4 |\n") and table_problems(head + "text\n")
    assert table_problems(head + "\ntext\n") == [] and table_problems(head + "\n| x | y |\n|---|---|\n") == []
