"""Loading benchmark rows into canonical :class:`Comparison` records.

Data comes from the hub through ``datasets`` or from a local copy (``data_dir``): a directory holding the
dataset's parquet files (as ``hf download --repo-type dataset`` lays them out), a single parquet file, or a
``Dataset.save_to_disk`` directory. In a directory, a file counts for a benchmark only when its path names
the benchmark's split and config exactly (``t2i/test-00000-of-00001.parquet`` is MMRB2 t2i, split test;
``train_v1-*.parquet`` is not split ``train``); a single file given directly is taken as is. Images stay encoded (bytes) until a reward decodes
them through :mod:`rewardkit.media`; their hashes key the score cache.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from .._imports import require
from ..errors import RewardkitError
from .spec import BenchmarkSpec

__all__ = ["Comparison", "BenchDataError", "load_comparisons", "parse_label", "comparisons_from_rows",
           "bytes_hash", "resolve_local_files", "check_distinct_files", "check_shards", "check_duplicate_ids"]

_IMAGE_TAG = re.compile(r"<image_\d+>")


class BenchDataError(RewardkitError, ValueError):
    """The benchmark data cannot be found, read or parsed; the message says what to do."""


@dataclass
class Comparison:
    """One pairwise comparison in canonical form (``reference/benchmarks.md`` section 5.6).

    ``label`` is +1 (A / left / candidate_1 better), -1 (B better) or 0 (human tie); ``tie_kind`` is
    "good" / "bad" for GenAI-Bench ties. ``sources`` holds the encoded source images ([] for t2i).
    """

    index: int
    item_id: str
    group_id: str
    prompt: str
    image_a: bytes
    image_b: bytes
    label: int
    raw_label: str
    sources: list[bytes] = field(default_factory=list)
    tie_kind: str | None = None
    model_a: str | None = None
    model_b: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    n_images_a: int = 1
    n_images_b: int = 1
    hash_a: str = ""
    hash_b: str = ""
    source_hashes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # content hashes key the score cache; computed once per record
        self.hash_a = self.hash_a or bytes_hash(self.image_a)
        self.hash_b = self.hash_b or bytes_hash(self.image_b)
        self.source_hashes = self.source_hashes or [bytes_hash(s) for s in self.sources]


def bytes_hash(data: bytes) -> str:
    """Content hash of encoded image bytes (the cache key component): XXH3-128, about 6x faster than SHA-256
    here (hashing was a third of data-loading time). A cache key needs no resistance to crafted collisions,
    only to accidental ones, which 128 bits give."""
    return _xxhash().xxh3_128_hexdigest(data)


def _xxhash():
    global _XXHASH
    if _XXHASH is None:
        _XXHASH = require("xxhash", "bench", "hashing benchmark images")
    return _XXHASH


_XXHASH = None


# ------------------------------------------------------------------------------------------ labels
def parse_label(kind: str, raw: Any, letters: Any = None) -> tuple[int, str | None]:
    """``(h, tie_kind)`` from a raw label; raises ``ValueError`` for anything unrecognised.

    - ``chosen_ab`` (MMRB2): "A" -> +1, "B" -> -1, case-insensitive. No ties.
    - ``vote_type`` (GenAI-Bench): leftvote +1, rightvote -1, tievote 0 ("good"), bothbad_vote 0 ("bad").
    - ``ranking`` (EditReward-Bench): ``letters`` is ``comparison_type`` like "AvsC" (first letter =
      candidate_1); any "=" is a tie; otherwise the letter before ">" wins.
    """
    if raw is None:
        raise ValueError("label is missing")
    s = str(raw).strip()
    if kind == "chosen_ab":
        u = s.upper()
        if u == "A":
            return 1, None
        if u == "B":
            return -1, None
        raise ValueError(f"chosen must be 'A' or 'B', got {raw!r}")
    if kind == "vote_type":
        table = {"leftvote": (1, None), "rightvote": (-1, None), "tievote": (0, "good"), "bothbad_vote": (0, "bad")}
        if s.lower() not in table:
            raise ValueError(f"vote_type must be one of {sorted(table)}, got {raw!r}")
        return table[s.lower()]
    if kind == "ranking":
        if letters is None:
            raise ValueError("ranking labels need comparison_type")
        parts = str(letters).strip().upper().split("VS")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"comparison_type must look like 'AvsB', got {letters!r}")
        c1, c2 = parts
        if "=" in s:
            low = s.lower()
            return 0, ("good" if "good" in low else "bad" if "bad" in low else None)
        if ">" not in s:
            raise ValueError(f"ranking must look like 'A>B' or 'A=B', got {raw!r}")
        winner = s.split(">")[0].strip().upper()
        if winner == c1:
            return 1, None
        if winner == c2:
            return -1, None
        raise ValueError(f"ranking {raw!r} names neither side of comparison_type {letters!r}")
    raise ValueError(f"unknown label kind {kind!r}")


# ------------------------------------------------------------------------------------------ images
def _image_bytes(x: Any, base: Path | None) -> bytes:
    if isinstance(x, dict):
        if x.get("bytes"):
            return bytes(x["bytes"])
        if x.get("path"):
            p = Path(x["path"])
            if not p.is_absolute() and base is not None:
                p = base / p
            if p.is_file():
                return p.read_bytes()
            raise ValueError(f"image has no bytes and its path {x['path']!r} does not exist")
        raise ValueError("image struct has neither bytes nor path")
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, (str, Path)):
        p = Path(x) if Path(x).is_absolute() or base is None else base / x
        return p.read_bytes()
    if hasattr(x, "save") and hasattr(x, "mode"):  # a decoded PIL image: re-encode losslessly
        buf = io.BytesIO()
        x.save(buf, format="PNG")
        return buf.getvalue()
    raise ValueError(f"cannot read an image from {type(x).__name__}")


def _image_list(x: Any, base: Path | None) -> list[bytes]:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [_image_bytes(e, base) for e in x if e is not None]
    return [_image_bytes(x, base)]


# ------------------------------------------------------------------------------------------ rows -> records
def comparisons_from_rows(spec: BenchmarkSpec, rows: Iterable[dict[str, Any]], *, base: Path | None = None,
                          start: int = 0) -> Iterator[Comparison]:
    """Turn raw dataset rows (dicts; images as ``{"bytes", "path"}`` structs, bytes or PIL) into records."""
    f = spec.fields
    extra_cols = list(f.get("extra") or ()) + [c for c in spec.categories if c not in (f.get("extra") or ())]
    mapped = {v for k, v in f.items() if k != "extra" and isinstance(v, str)}
    for i, row in enumerate(rows, start):
        try:
            h, tie_kind = parse_label(spec.label, row.get(f["label"]),
                                      row.get(f["letters"]) if f.get("letters") else None)
            prompt = row.get(f["prompt"])
            if not isinstance(prompt, str):
                raise ValueError(f"prompt column {f['prompt']!r} is {type(prompt).__name__}, not a string")
            if spec.strip_image_tags:
                prompt = re.sub(r"\s+", " ", _IMAGE_TAG.sub(" ", prompt)).strip()
            ims_a = _image_list(row.get(f["image_a"]), base)
            ims_b = _image_list(row.get(f["image_b"]), base)
            if not ims_a or not ims_b:
                raise ValueError("a candidate image is missing")
            sources = _image_list(row.get(f["sources"]), base) if f.get("sources") else []
        except (ValueError, OSError) as exc:
            raise BenchDataError(f"{spec.name}: row {i}: {exc}") from None
        item_id = str(row[f["id"]]) if f.get("id") and row.get(f["id"]) is not None else str(i)
        group_id = item_id
        if spec.group_id:
            g = row.get(spec.group_id["field"])
            sep = spec.group_id.get("split")
            group_id = str(g).split(sep)[0] if sep else str(g)
        yield Comparison(
            index=i, item_id=item_id, group_id=group_id, prompt=prompt, image_a=ims_a[0], image_b=ims_b[0],
            label=h, raw_label=str(row.get(f["label"])), sources=sources, tie_kind=tie_kind,
            model_a=row.get(f["model_a"]) if f.get("model_a") else None,
            model_b=row.get(f["model_b"]) if f.get("model_b") else None,
            # the spec's extra columns, plus every other scalar column (for --by breakdowns)
            extra={**{c: v for c, v in row.items() if c not in mapped and isinstance(v, (str, int, float, bool))},
                   **{c: _jsonable(row.get(c)) for c in extra_cols if c in row}},
            n_images_a=len(ims_a), n_images_b=len(ims_b))


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def _table_rows(table: Any, spec: BenchmarkSpec, batch_rows: int = 256) -> Iterator[dict[str, Any]]:
    """Rows of a pyarrow table (raw image structs), after the spec's column filter."""
    for key, want in (spec.filter or {}).items():
        if key in table.column_names:
            import pyarrow.compute as pc

            table = table.filter(pc.equal(table[key], want))
    for batch in table.to_batches(max_chunksize=batch_rows):
        yield from batch.to_pylist()


_SHARD = re.compile(r"-\d{5}-of-\d{5}$")


def _split_of(stem: str) -> str:
    """``test_v1-00000-of-00001`` -> ``test_v1``: the split a hub-layout parquet file name carries."""
    return _SHARD.sub("", stem)


def _names_split(rel: Path, split: str) -> bool:
    """Does ``rel`` name ``split`` exactly (file stem, a ``_``/``-``/``.`` suffixed stem, or a folder)?"""
    stem = _split_of(rel.name.removesuffix(".parquet"))
    if stem == split or any(stem.endswith(sep + split) for sep in "_-."):
        return True
    return split in rel.parts[:-1]


def _names_config(rel: Path, config: str) -> bool:
    """Does ``rel`` name ``config`` exactly (a folder, or a ``config_``/``config-`` file-name prefix)?"""
    if config in rel.parts[:-1]:
        return True
    stem = rel.name.removesuffix(".parquet")
    return any(stem.startswith(config + sep) for sep in "_-.")


def _strict_match(spec: BenchmarkSpec, rel: Path) -> bool:
    if spec.data_files:  # the hub maps these files to the split: the folder in the pattern is the discriminator
        return True
    if spec.config and not _names_config(rel, spec.config):
        return False
    return _names_split(rel, spec.split)


def resolve_local_files(spec: BenchmarkSpec, root: Path) -> list[Path]:
    """The parquet files of ``spec`` under ``root`` (a file is returned as is). Only files whose path names the
    spec's split and config exactly count; several matching files must agree on the split's name."""
    if root.is_file():
        return [root]
    anchor = root.parent  # the root's own name counts as a folder: NAME=DIR may point at .../t2i
    seen: list[Path] = []
    for pattern in spec.local_files:
        found = sorted(p for p in root.glob(pattern) if p.is_file())
        seen += [p for p in found if p not in seen]
        ok = [p for p in found if _strict_match(spec, p.relative_to(anchor))]
        if ok:
            check_shards(spec, ok)
            return ok
    want = f"split {spec.split!r}" + (f", config {spec.config!r}" if spec.config and not spec.data_files else "")
    near = ""
    if seen:
        near = (f" Found {', '.join(str(p.relative_to(root)) for p in seen[:6])}"
                f"{' ...' if len(seen) > 6 else ''}, but no file whose path names {want} exactly (e.g. "
                f"{spec.local_files[0]}); rename or move it, or give the file itself: --data-dir "
                f"{spec.name}=FILE.parquet.")
    raise BenchDataError(
        f"{spec.name}: no data under {root}: looked for {', '.join(spec.local_files)} ({want}).{near} Download "
        f"the dataset ({spec.dataset}) with `hf download --repo-type dataset {spec.dataset} --local-dir DIR`"
        " and pass --data-dir DIR.")


_SHARD_PARTS = re.compile(r"^(?P<base>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})$")


def check_shards(spec: BenchmarkSpec, files: list[Path]) -> None:
    """Refuse a mixed shard set: files of one split in one folder that come from different downloads
    (``test-00000-of-00001`` beside ``test-00000-of-00002``), a set with a shard missing, or one shard twice.
    Concatenating them would score stale rows beside new ones, silently."""
    sets: dict[tuple[Path, str], list[tuple[int, int, Path]]] = {}
    for p in files:
        m = _SHARD_PARTS.match(p.name.removesuffix(".parquet"))
        if m:
            sets.setdefault((p.parent, m.group("base")), []).append((int(m.group("i")), int(m.group("n")), p))
    for (folder, base), shards in sets.items():
        totals = sorted({n for _, n, _ in shards})
        names = ", ".join(sorted(p.name for _, _, p in shards))
        if len(totals) > 1:
            raise BenchDataError(
                f"{spec.name}: mixed shard sets in {folder}: {names} (shard counts {', '.join(map(str, totals))}): "
                "files of two different downloads. Delete the stale ones (keep one complete "
                f"'{base}-NNNNN-of-MMMMM' set) and rerun.")
        n = totals[0]
        have = sorted(i for i, _, _ in shards)
        if have != list(range(n)):
            raise BenchDataError(
                f"{spec.name}: incomplete shard set in {folder}: {names} (expected shards 00000 to {n - 1:05d} of "
                f"{n:05d}). Download the missing shards (or all of {spec.dataset} again) and rerun.")


def check_duplicate_ids(spec: BenchmarkSpec, tables: list[Any], files: list[Path]) -> None:
    """Refuse data in which one comparison id (the spec's id column, after its row filter) appears in two files:
    stale and new copies of a file read together. The message names the files holding each duplicate. Repeats
    within one file are the dataset's own layout and left alone (whether EditReward-Bench's K>=3 rows share an
    id is not verified: RewardHarness groups by the whole id)."""
    col = spec.fields.get("id")
    if not col:
        return
    where: dict[Any, list[str]] = {}
    for table, f in zip(tables, files):
        if col not in table.column_names:
            return  # the missing column is reported by the loader
        for key, want in (spec.filter or {}).items():
            if key in table.column_names:
                import pyarrow.compute as pc

                table = table.filter(pc.equal(table[key], want))
        for v in set(table.column(col).to_pylist()):
            where.setdefault(v, []).append(f.name)
    dups = {k: v for k, v in where.items() if len(v) > 1}
    if dups:
        ex = list(dups.items())[:3]
        files_named = sorted({f for v in dups.values() for f in v})
        raise BenchDataError(
            f"{spec.name}: {len(dups)} comparison id(s) appear in more than one file ({'; '.join(f'{k!r} in {v}' for k, v in ex)}"
            f"{' ...' if len(dups) > 3 else ''}); files: {', '.join(files_named)}. Remove the stale copy and rerun.")


_local_files = resolve_local_files  # the name the loader used before


def check_distinct_files(resolved: dict[str, tuple[BenchmarkSpec, list[Path]]]) -> None:
    """Refuse two benchmarks that would read the same files (unless their specs filter rows differently, as
    EditReward's K=2/3/4 do on the hub's combined file)."""
    names = list(resolved)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (sa, fa), (sb, fb) = resolved[a], resolved[b]
            shared = {p.resolve() for p in fa} & {p.resolve() for p in fb}
            if shared and not (sa.filter and sb.filter and sa.filter != sb.filter):
                raise BenchDataError(
                    f"{a} and {b} both resolve to {', '.join(sorted(str(p) for p in shared)[:3])}: one file "
                    "cannot be both benchmarks. Point each at its own data (--data-dir NAME=DIR per benchmark, or "
                    "the dataset's own folder layout, see `rewardkit bench --list`)")


def _read_local(spec: BenchmarkSpec, root: Path) -> tuple[Any, dict[str, Any]]:
    pa = require("pyarrow", "bench", "reading benchmark parquet files")
    if root.is_dir() and (root / "state.json").is_file() and (root / "dataset_info.json").is_file():
        datasets = require("datasets", "bench", "reading a saved dataset")
        ds = datasets.load_from_disk(str(root))
        return ds.with_format("arrow")[:], {"source": "save_to_disk", "path": str(root)}
    import pyarrow.parquet as pq

    files = _local_files(spec, root)
    try:
        tables = [pq.read_table(f) for f in files]
        check_duplicate_ids(spec, tables, files)
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    except (pa.ArrowException, OSError) as exc:
        raise BenchDataError(f"{spec.name}: cannot read parquet under {root}: {exc}") from None
    return table, {"source": "local", "path": str(root), "files": [str(p.relative_to(root)) if root.is_dir()
                                                                     else p.name for p in files]}


def _read_hub(spec: BenchmarkSpec, revision: str | None) -> tuple[Any, dict[str, Any]]:
    datasets = require("datasets", "bench", "downloading benchmark data")
    kwargs: dict[str, Any] = {"split": spec.split, "revision": revision}
    if spec.data_files:
        kwargs["data_files"] = {spec.split: spec.data_files}
    args = [spec.dataset] + ([spec.config] if spec.config else [])
    howto = (f"Or download it elsewhere (`hf download --repo-type dataset {spec.dataset} "
             f"--local-dir DIR`) and pass --data-dir DIR.")
    try:
        ds = datasets.load_dataset(*args, **kwargs)
    except Exception as exc:  # translate the hub's many failure types into one actionable message
        text = f"{type(exc).__name__}: {exc}"
        low = text.lower()
        if "offline" in low or "couldn't reach" in low or isinstance(exc, (ConnectionError, TimeoutError)):
            gated = (f" It is gated: accept its terms at https://huggingface.co/datasets/{spec.dataset} and log "
                     "in first." if spec.gated else "")
            raise BenchDataError(f"{spec.name}: cannot reach the hub for {spec.dataset} ({text}).{gated} "
                                 f"{howto}") from None
        if spec.gated or "gated" in low or "401" in text or "403" in text:
            raise BenchDataError(
                f"{spec.name}: {spec.dataset} is a gated dataset. Accept its terms at "
                f"https://huggingface.co/datasets/{spec.dataset}, then log in (`hf auth login` or set HF_TOKEN). "
                f"{howto} ({text})") from None
        raise BenchDataError(f"{spec.name}: cannot load {spec.dataset} from the hub ({text}). {howto}") from None
    info = {"source": "hub", "dataset": spec.dataset, "config": spec.config, "split": spec.split,
            "revision": revision, "fingerprint": getattr(ds, "_fingerprint", None)}
    return ds.with_format("arrow")[:], info


def load_comparisons(spec: BenchmarkSpec, data_dir: str | Path | None = None, *, revision: str | None = None,
                     limit: int | None = None) -> tuple[list[Comparison], dict[str, Any]]:
    """All comparisons of ``spec`` plus a dict describing where they came from.

    ``data_dir`` None loads from the hub; ``limit`` keeps the first N rows (after the spec's filter), or the
    first N groups for group benchmarks (EditReward-Bench K >= 3), so no group is cut.
    """
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        if not root.exists():
            raise BenchDataError(f"{spec.name}: data path {root} does not exist")
        table, info = _read_local(spec, root)
        base = root if root.is_dir() else root.parent
    else:
        table, info = _read_hub(spec, revision)
        base = None
    missing = [spec.fields[k] for k in ("image_a", "image_b", "label", "prompt", "sources", "letters", "id")
               if spec.fields.get(k) and spec.fields[k] not in table.column_names]
    if missing:
        raise BenchDataError(f"{spec.name}: columns {missing} are missing; the data has {table.column_names}. "
                             "Is this the right dataset / config?")
    rows = _table_rows(table, spec)
    out: list[Comparison] = []
    groups: set[str] = set()
    for c in comparisons_from_rows(spec, rows, base=base):
        if limit is not None:
            # group benchmarks keep whole groups: the first `limit` groups
            if spec.group_id:
                if c.group_id not in groups and len(groups) >= limit:
                    break
                groups.add(c.group_id)
            elif len(out) >= limit:
                break
        out.append(c)
    if not out:
        raise BenchDataError(f"{spec.name}: no rows after filtering ({spec.filter or 'no filter'})")
    info["n_rows"] = len(out)
    if spec.task == "edit" and not any(c.sources for c in out):
        msg = (f"{spec.name}: no row has a source image (column {spec.fields.get('sources')!r} is empty): an edit "
               "benchmark without sources scores edits as text-to-image. Is this the right data?")
        info.setdefault("warnings", []).append(msg)
        warnings.warn(msg, stacklevel=2)
    return out, info
