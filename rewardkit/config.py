"""Dataclass configs from YAML (``yaml.safe_load``) with ``key=value`` overrides.

- Nested dataclasses are addressed with dots: ``optim.lr=1e-4``.
- Override values are parsed as YAML scalars / flow collections (``true``, ``3``, ``1e-4``, ``[1, 2]``).
- Booleans are ``true`` / ``false`` only (YAML 1.2): ``no``, ``off``, ``yes``, ``on`` stay words, so
  ``mixed_precision: no`` and ``detectors.mode: off`` mean what they say. A boolean field also accepts those
  words (``lora.enabled: yes``).
- Unknown keys are errors, and every unknown key is listed at once (with close matches).
- Layers (defaults, preset, YAML, ``key=value``, keyword arguments) merge key by key, except a mapping field
  declared with ``field(metadata={"merge": False})`` (a mapping that names a set, such as a trainer's
  ``rewards: {name: weight}``): a later layer that gives it as a mapping replaces it whole, while a dotted
  override (``rewards.clip=0.5``) still sets one entry of it. A mapping field declared
  ``field(metadata={"keys_of": "rewards"})`` (per-entry options, such as ``reward_kwargs``) merges key by key but
  drops the entries of earlier layers for names that such a replacing ``rewards`` no longer holds.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml

from .errors import ConfigError

__all__ = ["iter_jsonl", "load_config", "build_config", "parse_overrides", "config_to_dict", "save_config", "safe_load_yaml",
           "YAMLConfigError", "MAX_YAML_NODES"]


def _yaml12_booleans(base: type) -> type:
    """``base`` (a safe loader) with YAML 1.2 booleans: only true / false, in any case; yes / no / on / off /
    y / n stay strings (YAML 1.1 reads them as booleans, which turns ``mode: off`` into False)."""
    resolvers = {ch: [(tag, rx) for tag, rx in entries if tag != "tag:yaml.org,2002:bool"]
                 for ch, entries in base.yaml_implicit_resolvers.items()}
    loader = type(f"Rewardkit{base.__name__}", (base,), {"yaml_implicit_resolvers": resolvers})
    loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    return loader


_LOADER = _yaml12_booleans(getattr(yaml, "CSafeLoader", yaml.SafeLoader))
_BOOL_WORDS = {"true": True, "yes": True, "on": True, "y": True, "false": False, "no": False, "off": False, "n": False}


#: the most nodes a YAML document may expand to, aliases counted at their full size (a "billion laughs"
#: document of 10^8 references is a few hundred bytes; every config, spec and template rewardkit reads is tiny)
MAX_YAML_NODES = 1_000_000
#: a scalar counts as one node per this many characters (so the bound is one on the expanded size too: a 100 KB
#: string aliased 2,000 times is 200 MB of text from a 100 KB file)
_SCALAR_CHARS_PER_NODE = 64


class YAMLConfigError(ConfigError, yaml.YAMLError):
    """A YAML document rewardkit refuses: malformed, a tag the safe loader does not construct (``!!python/...``,
    any ``!tag``), or an alias bomb. A :class:`ConfigError` (the CLI's exit 2) and still a ``yaml.YAMLError``."""


def _check_expansion(text: str, limit: int) -> None:
    """Refuse a document whose expansion (each alias counted as the size of what it refers to) exceeds
    ``limit`` nodes, from the parser's events, before anything is constructed."""
    sizes: dict[str, int] = {}
    totals, anchors = [0], []
    for ev in yaml.parse(text, Loader=_LOADER):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            totals.append(0)
            anchors.append(ev.anchor)
            continue
        if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            n = 1 + totals.pop()
            anchor = anchors.pop()
            if anchor is not None:
                sizes[anchor] = n
        elif isinstance(ev, yaml.ScalarEvent):
            n = 1 + len(ev.value) // _SCALAR_CHARS_PER_NODE  # a long string aliased many times is a bomb too
            if ev.anchor is not None:
                sizes[ev.anchor] = n
        elif isinstance(ev, yaml.AliasEvent):
            if ev.anchor in anchors:  # the alias of a node still open: the node contains itself
                raise YAMLConfigError(f"the YAML document has a recursive alias (*{ev.anchor} inside &{ev.anchor}): "
                                      "refused (a config is a tree)")
            n = sizes.get(ev.anchor, 1)
        else:
            continue
        totals[-1] += n
        if totals[-1] > limit:
            raise YAMLConfigError(f"the YAML document expands to more than {limit:,} nodes through its aliases "
                                  "(&anchor / *alias): refused (an alias bomb?)")


def safe_load_yaml(text: str, *, source: Any = None, max_nodes: int | None = None) -> Any:
    """``yaml.safe_load`` through libyaml's C loader when present (the same safe constructors, ~10x faster),
    with YAML 1.2 booleans (``true`` / ``false`` only; ``no`` / ``off`` / ``yes`` / ``on`` are strings).

    Bounded: a document that expands to more than ``max_nodes`` (default :data:`MAX_YAML_NODES`) nodes through
    its aliases (a scalar counted as one node per 64 characters), or that holds a recursive alias (a node that
    contains itself), is refused before it is constructed. Every refusal (malformed YAML, a tag the safe loader
    does not construct, an alias bomb, nesting too deep) is a :class:`YAMLConfigError` naming ``source`` when
    given."""
    where = f"{source}: " if source is not None else ""
    try:
        _check_expansion(text, MAX_YAML_NODES if max_nodes is None else max_nodes)
        return yaml.load(text, Loader=_LOADER)
    except YAMLConfigError as exc:
        raise YAMLConfigError(f"{where}{exc}") from None
    except yaml.YAMLError as exc:
        raise YAMLConfigError(f"{where}not a valid (safe) YAML document: {exc}") from None
    except RecursionError:  # nesting deeper than the pure-Python loader's recursion (libyaml refuses it itself)
        raise YAMLConfigError(f"{where}the YAML document nests too deeply (exceeded maximum nesting depth): "
                              "refused") from None

T = TypeVar("T")


def iter_jsonl(path: str | Path, *, error: type[Exception] = ValueError):
    """``(line number, value)`` for each non-blank line of a JSONL file, read as it goes; a line that is not JSON
    raises ``error("PATH:LINE: not JSON (...)")``. Callers check the values' shape with their own messages."""
    import json

    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{lineno}: not JSON ({exc})") from None


def parse_overrides(overrides: Sequence[str], *, patches: bool = False) -> dict[str, Any]:
    """``["a=1", "b.c=x"]`` -> ``{"a": 1, "b": {"c": "x"}}``. With ``patches`` the mappings made from dotted keys
    are :class:`Patch` objects, for :func:`build_config` (they edit a ``merge: False`` field instead of replacing it;
    the merged config holds plain dicts again)."""
    out: dict[str, Any] = {}
    bad = []
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            bad.append(item)
            continue
        key, raw = item.split("=", 1)
        try:
            value = safe_load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, Patch() if patches else {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {p!r}")
        node[parts[-1]] = value
    if bad:
        raise ConfigError("overrides must look like key=value; bad: " + ", ".join(repr(b) for b in bad)
                          + " (on the command line --set takes every word up to the next option: put file "
                          "arguments before --set)")
    return out


class Patch(dict):
    """A mapping built from dotted ``key=value`` overrides: it edits entries of the field it names, even of a
    field that a whole mapping would replace (``merge: False``)."""


def _field_info(cls: type | None, key: str) -> tuple[dataclasses.Field | None, type | None]:
    """The dataclass field ``key`` of ``cls`` (None when ``cls`` is not a dataclass or has no such field) and
    the dataclass type of its value, if any."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return None, None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        return None, None
    return fields[key], _dataclass_type(typing.get_type_hints(cls).get(key))


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None if f.default is dataclasses.MISSING else f.default


def _plain(v: Any) -> Any:
    """``v`` with every :class:`Patch` inside it made a plain dict (nothing downstream sees the marker)."""
    if isinstance(v, Patch):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()} if any(isinstance(x, (dict, list)) for x in v.values()) else v
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _merge(base: dict[str, Any], upd: Mapping[str, Any], cls: type | None = None) -> dict[str, Any]:
    """``upd`` layered over ``base``, mappings merged key by key. With the dataclass ``cls`` the layers are
    read as its config: a field declared ``metadata={"merge": False}`` is replaced by a whole mapping and
    edited by a :class:`Patch` (dotted overrides; applied over the field's default when ``base`` lacks it)."""
    out = dict(base)
    _drop_stale_keyed(out, upd, cls)
    for k, v in upd.items():
        f, sub = _field_info(cls, k)
        whole = f is not None and f.metadata.get("merge", True) is False
        if whole and isinstance(v, Mapping) and not isinstance(v, Patch):
            out[k] = _plain(dict(v))
            continue
        if whole and isinstance(v, Patch) and k not in out:
            default = _field_default(f)
            if isinstance(default, Mapping):
                out[k] = dict(default)
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v, sub)
        else:
            out[k] = _plain(v)
    return out


def _drop_stale_keyed(out: dict[str, Any], upd: Mapping[str, Any], cls: type | None) -> None:
    """A field declared ``metadata={"keys_of": "other"}`` (per-entry options of the set ``other``, such as a
    trainer's ``reward_kwargs`` of its ``rewards``) loses the entries of earlier layers that the set ``upd``
    replaces whole no longer names (a preset's PickScore options must not outlive ``rewards={clip: 1}``)."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return
    for f in dataclasses.fields(cls):
        owner = f.metadata.get("keys_of")
        new = upd.get(owner) if owner is not None else None
        if isinstance(new, Mapping) and not isinstance(new, Patch) and isinstance(out.get(f.name), Mapping):
            out[f.name] = {k: v for k, v in out[f.name].items() if k in new}


def _unknown_keys(cls: type, data: Mapping[str, Any], prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = []
    for k, v in data.items():
        if k not in fields:
            close = difflib.get_close_matches(k, list(fields), n=1)
            unknown.append(f"{prefix}{k}" + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
            continue
        sub = _dataclass_type(hints.get(k))
        if sub is not None and isinstance(v, Mapping):
            unknown += _unknown_keys(sub, v, prefix=f"{prefix}{k}.")
    return unknown


def _dataclass_type(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    for arg in typing.get_args(tp) or ():
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
    return None


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Light type checking: ints become floats for float fields, tuples from lists; mismatches raise."""
    if tp is Any or value is None:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: {value!r} does not match {tp}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: {value!r} is not one of {typing.get_args(tp)}")
        return value
    if origin in (tuple, list) or tp in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return (origin or tp)(value)
    if origin in (dict,) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool and isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            return float(value)  # YAML reads "1e-4" (no dot) as a string
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if tp in (int, float, str, bool):
        if tp is int and isinstance(value, bool) or not isinstance(value, tp):
            if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def _instantiate(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        sub = _dataclass_type(hints.get(f.name))
        if sub is not None and isinstance(value, Mapping):
            value = _instantiate(sub, value, prefix=f"{prefix}{f.name}.")
        elif sub is None:
            value = _coerce(hints.get(f.name, Any), value, f"{prefix}{f.name}")
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    return dict(cfg)


def build_config(cls: type[T], config: Any = None, overrides: Mapping[str, Any] | None = None) -> T:
    """Instance of ``cls`` from another instance, a mapping, a YAML path or None, plus keyword overrides."""
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, cls):
        data = config_to_dict(config)
    elif dataclasses.is_dataclass(config):
        raise ConfigError(f"expected a {cls.__name__}, got {type(config).__name__}")
    elif isinstance(config, Mapping):
        data = dict(config)
    elif isinstance(config, (str, Path)):
        data = _read_yaml(config)
    else:
        raise ConfigError(f"cannot build {cls.__name__} from {type(config).__name__}")
    data = _merge(data, overrides or {}, cls)
    unknown = _unknown_keys(cls, data)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} key(s): " + ", ".join(unknown))
    return _instantiate(cls, data)


def _read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    with p.open(encoding="utf-8") as fh:
        data = safe_load_yaml(fh.read(), source=p)  # malformed, a tag, an alias bomb: YAMLConfigError
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(data).__name__}")
    return dict(data)


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Load ``cls`` from a YAML file (optional) and ``key=value`` overrides (CLI style)."""
    data = _read_yaml(path) if path is not None else {}
    return build_config(cls, data, parse_overrides(overrides, patches=True))


def save_config(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), encoding="utf-8")
