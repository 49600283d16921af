"""Versioned prompt templates stored as YAML files under ``rewardkit/templates/<family>/<name>.yaml``.

A template file has a ``version`` (recorded in every reward output's ``info``), free-form string fields
that use ``str.format`` placeholders, and optional nested mappings of such strings. Changing a prompt
means a new file (or a bumped ``version``), never an edit in code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Template", "load_template", "TEMPLATE_ROOT"]

TEMPLATE_ROOT = Path(__file__).resolve().parents[1] / "templates"


@dataclass(frozen=True)
class Template:
    """A loaded template: ``family``, ``name``, ``version`` and its ``fields`` (strings / mappings)."""

    family: str
    name: str
    version: str
    fields: dict[str, Any]
    path: str

    @property
    def id(self) -> str:
        """``family/name@version``: what outputs record."""
        return f"{self.family}/{self.name}@{self.version}"

    def __getitem__(self, key: str) -> Any:
        if key not in self.fields:
            raise KeyError(f"template {self.id} has no field {key!r} (fields: {sorted(self.fields)})")
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def render(self, key: str, **values: Any) -> str:
        """``self[key].format(**values)`` with an error that names the missing placeholder."""
        try:
            return self[key].format(**values)
        except KeyError as exc:
            raise KeyError(f"template {self.id} field {key!r} needs placeholder {exc.args[0]!r}") from None


def load_template(family: str, name: str = "default") -> Template:
    """Load ``templates/<family>/<name>.yaml`` (``name`` may also be a path to a user YAML file)."""
    from ..config import safe_load_yaml

    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = TEMPLATE_ROOT / family / f"{name}.yaml"
    if not path.is_file():
        avail = sorted(p.stem for p in (TEMPLATE_ROOT / family).glob("*.yaml"))
        raise FileNotFoundError(f"no template {name!r} for {family!r}; available: {avail}")
    with open(path, encoding="utf-8") as f:
        data = safe_load_yaml(f.read(), source=path)  # a tag or an alias bomb: YAMLConfigError (a ConfigError)
    if not isinstance(data, dict) or "version" not in data:
        raise ValueError(f"template {path} must be a mapping with a 'version' key")
    data = dict(data)
    version = str(data.pop("version"))
    return Template(family=family, name=path.stem, version=version, fields=data, path=str(path))
