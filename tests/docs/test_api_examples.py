"""The API reference's examples (scripts/api_examples.py, shown on the API pages by scripts/docs_hooks.py) run
offline and print exactly the output the pages show (issue 40, item 7). Several compute by hand what the
function should return (z-scores, the Bradley–Terry loss, pairwise accuracy, a weighted sum, 51 / 255)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _examples():
    spec = importlib.util.spec_from_file_location("rk_api_examples", REPO / "scripts" / "api_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [(page, title, code, out) for page, exs in mod.API_EXAMPLES.items() for title, code, out in exs]


def _params():
    # the ones that load a model import transformers (seconds in a fresh process): slow; the pure ones are not
    return [pytest.param(*ex, id=ex[0], marks=[pytest.mark.slow] if "save_tiny_checkpoint" in ex[2] else [])
            for ex in _examples()]


@pytest.mark.parametrize("page,title,code,want", _params())
def test_api_example_prints_what_its_page_shows(page, title, code, want, monkeypatch, tmp_path):
    if "rewardkit.server" in code:
        pytest.importorskip("uvicorn")
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, f"{page}: {title}", "exec"), {"__name__": "__example__"})
    assert buf.getvalue() == want


def test_most_api_pages_have_examples():
    spec = importlib.util.spec_from_file_location("rk_docs_hooks_ex", REPO / "scripts" / "docs_hooks.py")
    pytest.importorskip("mkdocs")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    pages = {p for p, *_ in _examples()}
    assert pages <= set(hooks.API_PAGES) and len(pages) >= 10
    page = hooks.api_page("T", "intro", ["rewardkit.registry"], hooks.api_examples()["api/registry.md"])
    assert "## Examples" in page and "```python" in page and "Output:" in page
    assert page.index("## Examples") < page.index("::: rewardkit.registry")
