"""Finding the shards of a dataset: Parquet files / folders, WebDataset ``.tar`` shards, a Hugging Face dataset.

:func:`open_dataset` turns what the user typed (paths, folders, globs such as ``shards/*.tar`` or
``shard-{000..009}.tar``, a ``save_to_disk`` folder, a hub id) into a :class:`Dataset`: its format and an
ordered list of shards, each with a stable name (the output file of that shard is ``<name>.parquet``).
Reading the rows of a shard is :mod:`rewardkit.datasets.readers`. Standard library only at import.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError

FORMATS = ("parquet", "webdataset", "hf")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_GLOB_CHARS = re.compile(r"[*?\[]")
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


@dataclass
class Shard:
    """One unit of work and of output: a Parquet file, a tar file, or a contiguous row range of an HF dataset."""

    name: str                      # output file stem (unique in the dataset)
    path: str                      # the file (or dataset folder / hub id) it is read from
    start: int = 0                 # hf: first row of the range
    stop: int | None = None        # hf: one past the last row

    def __str__(self) -> str:
        return self.path if self.stop is None else f"{self.path}[{self.start}:{self.stop}]"


@dataclass
class Dataset:
    """A dataset to score or filter: its format, its shards in order, and (hf) the loaded ``datasets.Dataset``."""

    format: str
    shards: list[Shard]
    spec: list[str]
    hf: Any = None                 # datasets.Dataset for format "hf"
    split: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


#: most names a pattern's ``{a..b}`` ranges may expand to (a typo such as ``{0..99999999}`` is refused before any
#: name is made, instead of building millions of strings and stat-ing each)
MAX_BRACE_NAMES = 100_000


def brace_count(pattern: str) -> int:
    """How many names ``pattern``'s ranges expand to (the product of the range sizes), without expanding."""
    n = 1
    for lo, hi in _BRACE.findall(pattern):
        n *= max(int(hi) - int(lo) + 1, 0)
    return n


def expand_braces(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> ``a-000.tar a-001.tar a-002.tar`` (numeric ranges, zero padding kept). More than
    :data:`MAX_BRACE_NAMES` names: a :class:`UsageError`, raised before expanding."""
    if brace_count(pattern) > MAX_BRACE_NAMES:
        raise UsageError(f"{pattern}: the {{a..b}} ranges expand to {brace_count(pattern):,} names, more than "
                         f"{MAX_BRACE_NAMES:,}; give a glob (shards/*.tar) or the folder instead")
    return _expand(pattern)


def _expand(pattern: str) -> list[str]:
    m = _BRACE.search(pattern)
    if not m:
        return [pattern]
    lo, hi = m.group(1), m.group(2)
    width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
    out: list[str] = []
    for i in range(int(lo), int(hi) + 1):
        out += _expand(pattern[:m.start()] + str(i).zfill(width) + pattern[m.end():])
    return out


def _is_tar(p: str) -> bool:
    return p.lower().endswith(TAR_SUFFIXES)


def _is_hf_folder(p: Path) -> bool:
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


def looks_like_hub_id(s: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", s)) and not os.path.exists(s)


def _files_of(item: str) -> list[tuple[str, str, str]]:
    """(format, file, root) for one user argument; root is what shard names are made relative to."""
    if item.startswith("hf:") or looks_like_hub_id(item):
        return [("hf", item[3:] if item.startswith("hf:") else item, "")]
    if _GLOB_CHARS.search(item) or _BRACE.search(item):
        found: list[str] = []
        for pat in expand_braces(item):
            found += sorted(glob.glob(pat, recursive=True)) if _GLOB_CHARS.search(pat) else \
                ([pat] if os.path.exists(pat) else [])
        if not found:
            raise UsageError(f"{item}: the pattern matches no file")
        root = os.path.dirname(item.split("*")[0].split("{")[0].split("?")[0]) or "."
        return [(_file_format(f), f, root) for f in found]
    p = Path(item)
    if not p.exists():
        raise UsageError(f"{item}: no such file or folder (and not a hub id like org/name)")
    if _is_hf_folder(p):
        return [("hf", item, "")]
    if p.is_file():
        return [(_file_format(item), item, str(p.parent))]
    files = sorted(str(f) for f in p.rglob("*") if f.is_file() and not any(
        part.startswith((".", "_")) for part in f.relative_to(p).parts))
    parquet = [f for f in files if f.endswith(".parquet")]
    tars = [f for f in files if _is_tar(f)]
    if parquet and tars:
        raise UsageError(f"{item}: the folder holds both .parquet and .tar files; give one kind (e.g. {item}/*.tar)")
    if not parquet and not tars:
        raise UsageError(f"{item}: the folder holds no .parquet or .tar files and is not a datasets "
                         "save_to_disk folder (no state.json / dataset_dict.json)")
    return [("parquet" if parquet else "webdataset", f, item) for f in (parquet or tars)]


def _file_format(f: str) -> str:
    if f.endswith(".parquet"):
        return "parquet"
    if _is_tar(f):
        return "webdataset"
    if _is_hf_folder(Path(f)):
        return "hf"
    raise UsageError(f"{f}: not a .parquet file, a .tar shard or a datasets save_to_disk folder")


def _stem(file: str, root: str) -> str:
    rel = os.path.relpath(file, root) if root else os.path.basename(file)
    if rel.startswith(".."):
        rel = os.path.basename(file)
    for suf in (".parquet",) + TAR_SUFFIXES:
        if rel.lower().endswith(suf):
            rel = rel[: -len(suf)]
            break
    return rel.replace(os.sep, "__").replace("/", "__")


def open_dataset(spec: str | os.PathLike | Sequence[str], *, format: str | None = None, split: str | None = None,
                 num_shards: int | None = None) -> Dataset:
    """Resolve ``spec`` (one or several paths / globs / a hub id) into a :class:`Dataset`.

    Args:
        spec: Parquet files or folders, ``.tar`` shards (paths, globs, ``{000..009}`` ranges), a ``datasets``
            ``save_to_disk`` folder, or a hub id (``org/name`` or ``hf:org/name``; loaded with
            ``datasets.load_dataset``).
        format: force ``parquet`` / ``webdataset`` / ``hf`` instead of guessing.
        split: the split of a ``DatasetDict`` / hub dataset (needed when it has several).
        num_shards: hf only: how many contiguous row ranges to cut the dataset into (default: one per
            arrow file of the dataset, at least one).
    """
    items = [str(spec)] if isinstance(spec, (str, os.PathLike)) else [str(x) for x in spec]
    if not items:
        raise UsageError("no dataset given")
    found = [f for item in items for f in _files_of(item)]
    formats = {f[0] for f in found}
    if format is not None:
        if format not in FORMATS:
            raise UsageError(f"--format {format}: choose one of {', '.join(FORMATS)}")
        formats = {format}
    if len(formats) > 1:
        raise UsageError(f"the inputs mix formats ({', '.join(sorted(formats))}); score one kind at a time")
    fmt = formats.pop()
    if fmt == "hf":
        if len(found) != 1:
            raise UsageError("give one Hugging Face dataset (a save_to_disk folder or a hub id) at a time")
        return _open_hf(found[0][1], split, num_shards, items)
    shards: list[Shard] = []
    seen: dict[str, str] = {}
    for _, f, root in found:
        name = _stem(f, root)
        if name in seen and seen[name] != f:
            raise UsageError(f"two shards would write the same output {name}.parquet: {seen[name]} and {f}; "
                             "give their common parent folder instead")
        if name not in seen:
            seen[name] = f
            shards.append(Shard(name=name, path=f))
    return Dataset(format=fmt, shards=shards, spec=items)


def _open_hf(where: str, split: str | None, num_shards: int | None, items: list[str]) -> Dataset:
    from .._imports import require

    datasets = require("datasets", "data", "reading Hugging Face datasets")
    if _is_hf_folder(Path(where)):
        ds = datasets.load_from_disk(where)
    else:  # a hub id (HF_HUB_OFFLINE=1: only the local cache) or, with hf:, any folder load_dataset reads
        ds = datasets.load_dataset(where, split=split)
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in ds:
            raise UsageError(f"{where}: choose a split with --split ({', '.join(names)})")
        ds = ds[split]
    n = len(ds)
    k = num_shards or max(len(getattr(ds, "cache_files", []) or []), 1)
    k = max(min(k, n), 1)
    bounds = [round(i * n / k) for i in range(k + 1)]
    shards = [Shard(name=f"shard-{i:05d}-of-{k:05d}", path=where, start=bounds[i], stop=bounds[i + 1])
              for i in range(k)]
    return Dataset(format="hf", shards=shards, spec=items, hf=ds, split=split)
