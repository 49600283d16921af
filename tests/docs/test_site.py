"""The documentation site's generated pages (scripts/docs_hooks.py); CI builds the whole site with
`bash scripts/docs.sh build` (strict)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("mkdocs", reason="the `docs` extra (scripts/docs.sh installs it)")


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("rk_docs_hooks", REPO / "scripts" / "docs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_links_are_rewritten_for_the_site(hooks):
    md = ("[RL](docs/rl.md#resume) [bench](benchmarks/README.md) [recipes](recipes/nft) "
          "[`examples/images/`](examples/images) [gone](docs/nothere.md) [web](https://example.org/a.md) [top](#x)")
    out = hooks._rewrite_links(md, "README.md", "index.md")
    assert "[RL](rl.md#resume)" in out
    assert "[bench](project/benchmarks.md)" in out
    assert "`recipes` (`recipes/nft`)" in out  # a folder the site does not carry: named, not linked
    assert "`examples/images/`" in out and "](examples/images)" not in out
    assert "[gone](docs/nothere.md)" not in out and "[gone](nothere.md)" in out  # left for strict mode to report
    assert "[web](https://example.org/a.md)" in out and "[top](#x)" in out


def test_docs_pages_link_to_project_pages(hooks):
    out = hooks._rewrite_links("[b](../benchmarks/README.md#x) [z](zoo.md)", "docs/rl.md", "rl.md")
    assert out == "[b](project/benchmarks.md#x) [z](zoo.md)"
    out = hooks._rewrite_links("[c](../CHANGELOG.md) [r](../README.md) [t](README.md)", "tests/README.md",
                               "project/tests.md")
    assert out == "[c](changelog.md) [r](../index.md) [t](tests.md)"


def test_command_reference_covers_every_command(hooks):
    from rewardkit.cli import COMMANDS

    text = hooks.cli_reference()
    for name in COMMANDS:
        assert f"## `rewardkit {name}`" in text, name
    assert "### `rewardkit rl nft`" in text and "### `rewardkit parrot run`" in text


def test_every_docs_page_is_in_the_nav_and_every_api_object_exists(hooks):
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f": {page.name}" in nav, f"{page.name} is missing from mkdocs.yml's nav"
    import importlib

    for _page, (_title, _intro, objects) in hooks.API_PAGES.items():
        for obj in objects:
            try:
                importlib.import_module(obj)
                continue
            except ImportError:
                module, _, name = obj.rpartition(".")
            assert hasattr(importlib.import_module(module), name), obj


def test_readme_picture_is_rewritten_for_the_site(hooks):
    out = hooks._rewrite_links("![report](docs/images/first-report.png) ![w](https://x.org/a.png)", "README.md",
                               "index.md")
    assert out == "![report](images/first-report.png) ![w](https://x.org/a.png)"


def _griffe_roles():
    spec = importlib.util.spec_from_file_location("rk_griffe_roles", REPO / "scripts" / "griffe_roles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # griffe reads the whole package: seconds (the strict docs build checks the pages in CI too)
def test_sphinx_roles_become_cross_references_resolved_in_their_scope():
    """Issue 40 item 7: the API pages showed 195 raw `:func:` / `:class:` roles. Every role of every docstring
    becomes an optional autorefs reference to the full path, resolved where the docstring is (members, imports,
    parents); `~` shows the last component."""
    griffe = pytest.importorskip("griffe")
    roles = _griffe_roles()
    pkg = griffe.load("rewardkit", search_paths=[str(REPO)],
                      extensions=griffe.load_extensions(roles.SphinxRolesToRefs))
    objs = list(roles._walk(pkg, set()))
    left = [o.path for o in objs if o.docstring is not None and roles.ROLE.search(o.docstring.value)]
    assert not left, left[:5]
    refs = [m for o in objs if o.docstring is not None
            for m in re.findall(r'<autoref identifier="([^"]+)" optional>', o.docstring.value)]
    assert len(refs) > 300 and sum(r.startswith("rewardkit.") for r in refs) > 0.9 * len(refs)
    doc = pkg["view.images.ImageStore"].docstring.value  # ":meth:`table`" inside the class
    assert '<autoref identifier="rewardkit.view.images.ImageStore.table" optional><code>table</code>' in doc
    doc = pkg["view.images.thumbnail_data_uri"].docstring.value  # ":func:`thumbnail_bytes`" in its module
    assert 'identifier="rewardkit.view.images.thumbnail_bytes"' in doc


def test_a_raw_role_in_a_rendered_api_page_is_found(hooks):
    assert hooks.raw_roles("<p>see :func:<code>load_reward</code> and :class:`Reward`</p>") == [
        ":func:<code>load_reward", ":class:`Reward"]
    assert hooks.raw_roles("<pre><code>:func:`x`</code></pre><p><code>:func:</code> roles</p>") == []
