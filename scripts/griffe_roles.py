"""Griffe extension for the documentation site (mkdocs.yml names it; nothing here is part of the package).

rewardkit's docstrings name other objects with Sphinx roles (``:func:`load_reward```, ``:class:`~rewardkit.reward.Reward```,
``:meth:`table```, ``:mod:`rewardkit.client```), which Markdown would show as raw text. This extension rewrites
every role, when griffe loads a docstring, into a cross-reference for mkdocs-autorefs: the name resolved in the
docstring's own scope (the object, its class, its module, their imports), shown as code, linked to the object's
API entry when the site renders one, plain code otherwise (an ``optional`` reference: a private helper or a
third-party name never breaks the strict build). The docstrings stay as they are (readable with ``help()``); the
convention is one: Sphinx roles for cross-references, double backticks for other code.

``scripts/docs_hooks.py`` fails the build if a raw role is left in a rendered page.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

#: a Sphinx role in a docstring: ``:func:`x```, ``:py:class:`~a.B```, ``:meth:`x.y()```
ROLE = re.compile(r":(?:py:)?(?P<role>func|class|meth|mod|attr|data|exc|obj|const|type):`(?P<body>[^`]+)`")


def _resolve(obj: Any, name: str) -> str:
    """The full path of ``name`` as seen from ``obj``'s docstring: members and imports of the object, its
    parents up to the package; ``name`` itself (a full path already, or a third-party name) otherwise."""
    first, _, rest = name.partition(".")
    scope = obj
    while scope is not None:
        try:
            if first in scope.members or first in getattr(scope, "imports", {}):
                return scope.resolve(first) + (f".{rest}" if rest else "")
        except (griffe.NameResolutionError, KeyError, AttributeError):
            pass
        if first == getattr(scope, "name", None) and scope.parent is None:
            return name
        scope = scope.parent
    return name


def role_to_ref(match: re.Match, obj: Any) -> str:
    """One role as an optional autorefs reference: ``~`` shows the last component only, an explicit title
    (``title <target>``) is kept, ``()`` is dropped from the target."""
    body = match["body"].strip()
    explicit = re.match(r"^(?P<title>.+?)\s*<(?P<target>[^>]+)>$", body)
    if explicit:
        title, target = explicit["title"], explicit["target"]
    else:
        short = body.startswith("~")
        target = body.lstrip("~.!")
        title = target.rsplit(".", 1)[-1] if short else target
    target = target.removesuffix("()")
    full = _resolve(obj, target)
    return (f'<autoref identifier="{html.escape(full, quote=True)}" optional>'
            f"<code>{html.escape(title)}</code></autoref>")


def rewrite(text: str, obj: Any) -> str:
    return ROLE.sub(lambda m: role_to_ref(m, obj), text)


def _walk(obj: Any, seen: set[int]):
    if id(obj) in seen or getattr(obj, "is_alias", False):
        return
    seen.add(id(obj))
    yield obj
    for member in list(getattr(obj, "members", {}).values()):
        yield from _walk(member, seen)


class SphinxRolesToRefs(griffe.Extension):
    """Rewrite the Sphinx roles of every loaded docstring into autorefs cross-references, once the whole
    package is loaded (so a name is resolved against every module's members and imports)."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        for obj in _walk(pkg, set()):
            doc = getattr(obj, "docstring", None)
            if doc is not None and ":" in doc.value and "`" in doc.value:
                doc.value = rewrite(doc.value, obj)
