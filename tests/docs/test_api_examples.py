"""The API reference's examples (scripts/api_examples.py, shown on the API pages by scripts/docs_hooks.py) run
offline and print exactly the output the pages show (issue 40, item 7). Several compute by hand what the
function should return (z-scores, the Bradley–Terry loss, pairwise accuracy, a weighted sum, 51 / 255)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _examples():
    spec = importlib.util.spec_from_file_location("rk_api_examples", REPO / "scripts" / "api_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [(page, title, code, out) for page, exs in mod.API_EXAMPLES.items() for title, code, out in exs]


# an example that builds a tiny model (transformers: seconds in a fresh process) is slow; the pure ones are not
_LOADS_A_MODEL = ("save_tiny_checkpoint", ".tiny(", "from rewardkit.testing import tiny_", "tiny:")


def _needs(code: str) -> bool:
    """`# needs a CUDA GPU` (or any `# needs ...`): shown on its page without output, never run here."""
    return "# needs " in code


def _params():
    return [pytest.param(*ex, id=f"{ex[0]}: {ex[1]}",
                         marks=[pytest.mark.slow] if any(k in ex[2] for k in _LOADS_A_MODEL) else [])
            for ex in _examples() if not _needs(ex[2])]


@pytest.mark.parametrize("page,title,code,want", _params())
def test_api_example_prints_what_its_page_shows(page, title, code, want, monkeypatch, tmp_path):
    if "rewardkit.server" in code:
        pytest.importorskip("uvicorn")
    import types

    from rewardkit import registry

    monkeypatch.chdir(tmp_path)
    # run as a script runs: in a module of its own that `import` finds (a class it registers by name resolves)
    module = types.ModuleType("__example__")
    monkeypatch.setitem(sys.modules, "__example__", module)
    buf = io.StringIO()
    registered = dict(registry._programmatic)
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"{page}: {title}", "exec"), module.__dict__)
    finally:  # what an example registers leaves the registry with it
        registry._programmatic.clear()
        registry._programmatic.update(registered)
        registry._reset()
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


def test_an_example_that_needs_a_gpu_is_shown_without_output_and_is_valid_python():
    needs = [(page, title, code, out) for page, title, code, out in _examples() if _needs(code)]
    assert needs, "the judges page shows the vLLM backend, which needs a CUDA GPU"
    for page, title, code, out in needs:
        assert out == "", (page, title)       # no output is shown for what the suite cannot run
        compile(code, f"{page}: {title}", "exec")
    spec = importlib.util.spec_from_file_location("rk_docs_hooks_needs", REPO / "scripts" / "docs_hooks.py")
    pytest.importorskip("mkdocs")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.api_page("T", "intro", [], [needs[0][1:]])
    assert "```python" in page and "Output:" not in page


# ---------------------------------------------------------------------------------------------------------------
# Every public reward, function and class the API pages document has an example (issue 40, item 7): its name is
# in an example of its page (or its docstring holds a doctest). The ones still without are listed in
# tests/docs/api_examples_gaps.txt: the list may only shrink (an item that gains an example must leave it, a new
# public item must come with an example). Configuration dataclasses (``*Config``) are left out: each is the
# options of its reward, and the examples set them through ``load_reward(name, **options)``.
GAPS = REPO / "tests" / "docs" / "api_examples_gaps.txt"


def documented_items() -> dict[str, list[tuple[str, object]]]:
    """API page -> [(dotted path, object)]: what mkdocstrings renders for the page's objects (a class as it is;
    a module's public classes and functions defined in it, not the names it imports)."""
    import importlib
    import inspect

    spec = importlib.util.spec_from_file_location("rk_docs_hooks_inv", REPO / "scripts" / "docs_hooks.py")
    pytest.importorskip("mkdocs")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    out: dict[str, list[tuple[str, object]]] = {}
    for page, (_title, _intro, objects) in hooks.API_PAGES.items():
        for dotted in objects:
            try:
                mod = importlib.import_module(dotted)
            except ModuleNotFoundError:
                parent, attr = dotted.rsplit(".", 1)
                out.setdefault(page, []).append((dotted, getattr(importlib.import_module(parent), attr)))
                continue
            for name, obj in vars(mod).items():
                if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                    continue
                config = inspect.isclass(obj) and name.endswith("Config")
                if getattr(obj, "__module__", None) != mod.__name__ or config:
                    continue
                out.setdefault(page, []).append((f"{mod.__name__}.{name}", obj))
    return out


def items_without_example() -> list[str]:
    import inspect
    import re

    codes: dict[str, str] = {}
    for page, _title, code, _out in _examples():
        codes[page] = codes.get(page, "") + "\n" + code
    missing = []
    for page, items in documented_items().items():
        for dotted, obj in items:
            name = dotted.rsplit(".", 1)[1]
            if re.search(rf"\b{re.escape(name)}\b", codes.get(page, "")) or ">>>" in (inspect.getdoc(obj) or ""):
                continue
            missing.append(f"{page} {dotted}")
    return sorted(missing)


def _gaps() -> list[str]:
    return sorted(x for x in GAPS.read_text().splitlines() if x.strip() and not x.startswith("#"))


def test_every_public_item_of_the_api_pages_has_an_example_or_is_a_listed_gap():
    missing = items_without_example()
    gaps = _gaps()
    new = sorted(set(missing) - set(gaps))
    stale = sorted(set(gaps) - set(missing))
    assert not new, f"public items without an example on their API page (add one to scripts/api_examples*): {new}"
    assert not stale, f"these have an example now (or are gone): remove them from {GAPS.name}: {stale}"


def test_every_reward_class_and_the_judges_and_integrations_pages_have_no_gap():
    """The issue's first ask: every public reward, and the two pages that had no example at all."""
    from rewardkit.reward import Reward

    items = documented_items()
    rewards = [d for page, its in items.items() for d, obj in its
               if isinstance(obj, type) and issubclass(obj, Reward) and obj.__module__.startswith("rewardkit.rewards.")]
    assert len(rewards) >= 18
    missing = items_without_example()
    assert not [r for r in rewards if f"api/rewards.md {r}" in missing]
    assert not [g for g in missing if g.startswith(("api/judges.md", "api/integrations.md"))]
