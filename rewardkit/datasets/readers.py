"""Streaming the rows of one shard, a batch at a time (memory follows the batch size, not the dataset).

- Parquet: ``pyarrow.parquet.ParquetFile.iter_batches`` over the needed columns only.
- WebDataset: the tar is read as a stream (``tarfile`` mode ``r|*``); consecutive members sharing a key
  (``dir/key.ext``) form one sample whose columns are the extensions (``jpg``, ``txt``, ``json``, ...); a
  ``json`` member's fields are columns ``json.<field>``.
- Hugging Face: ``Dataset.select(range)`` of the memory-mapped table, ``Image`` features read undecoded.

Every batch is ``{"id": [...], "image": [...], "prompt": [...], "sources": [...] | None, "error": [...]}``:
images as encoded bytes, a path (relative paths resolve against the shard's folder), a PIL image or an array;
``error`` is the reason a row cannot be scored before any model sees it (e.g. a null image), else None.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..errors import UsageError
from .sources import Dataset, Shard

#: the largest tar member read into memory (bytes; ``REWARDKIT_MAX_TAR_MEMBER`` overrides): a bigger member is
#: not read (a sparse or highly compressed shard cannot make a reader allocate gigabytes): the samples that
#: need it are invalid with the reason, the others are scored
MAX_TAR_MEMBER = 256 << 20


def max_tar_member() -> int:
    v = os.environ.get("REWARDKIT_MAX_TAR_MEMBER")
    try:
        return int(v) if v else MAX_TAR_MEMBER
    except ValueError:
        raise UsageError(f"REWARDKIT_MAX_TAR_MEMBER={v!r}: give a number of bytes") from None


class TooLarge:
    """Stands for a tar member over :func:`max_tar_member` (not read): using it is the sample's error."""

    def __init__(self, name: str, size: int, limit: int):
        self.name, self.size, self.limit = name, size, limit

    def reason(self) -> str:
        return (f"member {self.name} is {self.size:,} bytes, over the {self.limit:,}-byte limit on a tar member "
                "(REWARDKIT_MAX_TAR_MEMBER)")


IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif")
PROMPT_DEFAULTS = ("prompt", "caption", "text", "txt")
IMAGE_DEFAULTS = ("image", "img", "jpg", "png")


@dataclass
class Columns:
    """Which input columns hold what. ``image=None`` / ``prompt=None`` pick a default (see :func:`resolve`)."""

    image: str | None = None
    prompt: str | None = None
    sources: Sequence[str] = ()
    id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"image": self.image, "prompt": self.prompt, "sources": list(self.sources), "id": self.id}


def resolve(ds: Dataset, cols: Columns, needs_prompt: bool, bad: dict[str, str] | None = None) -> Columns:
    """Fill in default column names and check every named column exists in every shard (exit 2 otherwise).

    WebDataset shards are not scanned up front (that would read them twice): a sample missing a column is
    that row's error. For Parquet every shard's footer is read: a column missing from one shard, or with a
    different type than in the first shard, stops the run naming the shard and the column. With ``bad`` (a
    dict; ``--skip-bad-shards``) such a shard is recorded there (name -> reason) instead, and the others go on.
    """
    def refuse(shard: Shard, reason: str) -> None:
        if bad is None:
            raise UsageError(reason)
        bad[shard.name] = reason

    if ds.format == "webdataset":
        for s in ds.shards:  # one header read each: a file that is not a tar stops the run before any scoring
            if not tarfile.is_tarfile(s.path):
                refuse(s, f"{s.path}: not a readable tar shard (no tar header)")
        return Columns(image=cols.image, prompt=cols.prompt or ("txt" if needs_prompt else None),
                       sources=list(cols.sources), id=cols.id)
    schemas = _schemas(ds, None if bad is None else refuse)
    if not schemas:
        raise UsageError("no shard of the dataset is readable: " + "; ".join((bad or {}).values()))
    first_name, first = schemas[0]
    names = list(first.names)
    image = cols.image or next((c for c in IMAGE_DEFAULTS if c in names), None)
    if image is None:
        raise UsageError(f"{first_name}: no image column (tried {', '.join(IMAGE_DEFAULTS)}); "
                         f"name it with --image-column (columns: {', '.join(names)})")
    prompt = cols.prompt or next((c for c in PROMPT_DEFAULTS if c in names), None)
    if needs_prompt and prompt is None:
        raise UsageError(f"{first_name}: no prompt column (tried {', '.join(PROMPT_DEFAULTS)}); "
                         f"name it with --prompt-column (columns: {', '.join(names)})")
    out = Columns(image=image, prompt=prompt, sources=list(cols.sources), id=cols.id)
    needed = [c for c in (out.image, out.prompt, out.id, *out.sources) if c]
    by_path = {s.path: s for s in ds.shards}
    for shard_name, schema in schemas:
        for c in needed:
            if c not in schema.names:
                refuse(by_path.get(shard_name, ds.shards[0]),
                       f"{shard_name}: no column {c!r} (columns: {', '.join(schema.names)})")
                break
            if schema.field(c).type != first.field(c).type:
                refuse(by_path.get(shard_name, ds.shards[0]),
                       f"{shard_name}: column {c!r} is {schema.field(c).type} but "
                       f"{first.field(c).type} in {first_name} (schema mismatch between shards)")
                break
    return out


def _schemas(ds: Dataset, refuse: Any = None) -> list[tuple[str, Any]]:
    if ds.format == "hf":
        return [(ds.shards[0].path, ds.hf.data.schema)]
    import pyarrow.parquet as pq

    out = []
    for s in ds.shards:
        try:
            out.append((s.path, pq.read_schema(s.path)))
        except Exception as exc:  # noqa: BLE001  pyarrow raises ArrowInvalid / OSError for a non-Parquet file
            reason = f"{s.path}: not a readable Parquet file ({type(exc).__name__}: {exc})"
            if refuse is None:
                raise UsageError(reason) from None
            refuse(s, reason)
    return out


def id_type(ds: Dataset, cols: Columns) -> Any:
    """The Arrow type of the output ``id`` column: the id column's own type, else string."""
    import pyarrow as pa

    if cols.id and ds.format != "webdataset":
        schema = _schemas(ds, lambda *_: None)[0][1] if ds.format == "parquet" else ds.hf.data.schema
        return schema.field(cols.id).type
    return pa.string()


def count_rows(ds: Dataset, shard: Shard) -> int | None:
    """Rows of a shard from metadata (None for a tar, which would have to be read)."""
    if ds.format == "hf":
        return (shard.stop or 0) - shard.start
    if ds.format == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(shard.path).metadata.num_rows
    return None


def resolve_image(v: Any, base: str) -> tuple[Any, str | None]:
    """A cell of an image column as something :mod:`rewardkit.media` reads, or an error."""
    if isinstance(v, dict):  # HF Image feature / Arrow struct {bytes, path}
        v = v.get("bytes") or v.get("path")
    if v is None:
        return None, "no image (the cell is null)"
    if isinstance(v, str):
        return (v if os.path.isabs(v) else os.path.join(base, v)), None
    if isinstance(v, list):  # a nested list (Arrow list / HF Array feature): an array of pixels
        import numpy as np

        # as it is: rewardkit.media's one pixel rule decides (integers outside [0, 255] are refused with their
        # range, never wrapped by a cast: 300 is not 44)
        return np.asarray(v), None
    return v, None


def _batch(ids: list, images: list, prompts: list, sources: list | None, errors: list) -> dict[str, list]:
    return {"id": ids, "image": images, "prompt": prompts, "sources": sources, "error": errors}


def iter_batches(ds: Dataset, shard: Shard, cols: Columns, batch_size: int, start: int = 0
                 ) -> Iterator[dict[str, list]]:
    """Yield the shard's rows in order from row ``start`` (a resumed shard), ``batch_size`` at a time (see the
    module docstring for the form). Parquet starts reading at the row group holding ``start``."""
    if ds.format == "webdataset":
        yield from _wds_batches(shard, cols, batch_size, start)
        return
    base = os.path.dirname(os.path.abspath(shard.path)) if ds.format == "parquet" else os.path.abspath(shard.path)
    needed = list(dict.fromkeys(c for c in (cols.image, cols.prompt, cols.id, *cols.sources) if c))
    row = start
    for table in _table_batches(ds, shard, needed, batch_size, start):
        n = table["__n__"]
        images, errors = [], []
        for v in table[cols.image]:
            img, err = resolve_image(v, base)
            images.append(img)
            errors.append(None if err is None else f"column {cols.image!r}: {err}")
        srcs = None
        if cols.sources:
            srcs = []
            for i in range(n):
                row_src = []
                for c in cols.sources:
                    for v in _images_in_cell(table[c][i]):
                        img, err = resolve_image(v, base)
                        if err and errors[i] is None:
                            errors[i] = f"source column {c!r}: {err}"
                        row_src.append(img)
                srcs.append(row_src)
        ids = table[cols.id] if cols.id else [f"{shard.name}:{row + i}" for i in range(n)]
        prompts = table[cols.prompt] if cols.prompt else [None] * n
        yield _batch(list(ids), images, list(prompts), srcs, errors)
        row += n


def shard_base(ds: Dataset, shard: Shard) -> str:
    """The folder relative image paths of a shard resolve against."""
    return os.path.dirname(os.path.abspath(shard.path)) if ds.format != "hf" else os.path.abspath(shard.path)


def iter_columns(ds: Dataset, shard: Shard, columns: Sequence[str], batch_size: int
                 ) -> Iterator[tuple[dict[str, list], list[str | None]]]:
    """Raw values of ``columns`` a batch at a time, with each row's error (a WebDataset member missing)."""
    columns = list(dict.fromkeys(columns))
    if ds.format != "webdataset":
        for t in _table_batches(ds, shard, columns, batch_size):
            yield {c: list(t[c]) for c in columns}, [None] * t["__n__"]
        return
    vals: dict[str, list] = {c: [] for c in columns}
    errs: list[str | None] = []
    for key, sample, _ in iter_wds_samples(shard.path):
        err = None
        for c in columns:
            v, e = (key, None) if c == "__key__" else wds_value(sample, c)
            vals[c].append(v)
            err = err or (f"{c}: {e}" if e else None)
        errs.append(err)
        if len(errs) == batch_size:
            yield vals, errs
            vals, errs = {c: [] for c in columns}, []
    if errs:
        yield vals, errs


def _images_in_cell(v: Any) -> list[Any]:
    """A source cell as a list of images: a list of bytes / paths / structs is several images; anything else
    (one image, or a nested list of pixel values) is one."""
    if isinstance(v, list) and v and isinstance(v[0], (bytes, str, dict)):
        return v
    return [v]


def _table_batches(ds: Dataset, shard: Shard, columns: list[str], batch_size: int, start: int = 0
                   ) -> Iterator[dict[str, Any]]:
    if ds.format == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(shard.path)
        groups, first = [], 0  # the row groups from the one holding `start`; rows before it in that group dropped
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if first + n <= start and not groups:
                first += n
                continue
            groups.append(g)
        drop = start - first
        if not groups:
            return
        for rb in pf.iter_batches(batch_size=batch_size, columns=columns, row_groups=groups):
            if drop:
                cut = min(drop, rb.num_rows)
                rb, drop = rb.slice(cut), drop - cut
                if rb.num_rows == 0:
                    continue
            d = {c: rb.column(c).to_pylist() for c in columns}
            d["__n__"] = rb.num_rows
            yield d
        return
    part = ds.hf.select(range(shard.start + start, shard.stop)).select_columns(columns)
    # Arrow batches of the memory-mapped table: an Image feature arrives as its stored {bytes, path} struct,
    # decoded later by rewardkit.media a chunk at a time
    for tbl in part.with_format("arrow").iter(batch_size=batch_size):
        b: dict[str, Any] = {c: tbl.column(c).to_pylist() for c in columns}
        b["__n__"] = tbl.num_rows
        yield b


def split_name(name: str) -> tuple[str, str] | None:
    """WebDataset's key / extension split: ``dir/abc.seg.png`` -> (``dir/abc``, ``seg.png``)."""
    d, base = os.path.split(name)
    if "." not in base or base.startswith("."):
        return None
    key, ext = base.split(".", 1)
    return (f"{d}/{key}" if d else key), ext.lower()


def iter_wds_samples(path: str, skip: int = 0) -> Iterator[tuple[str, dict[str, Any], list[tarfile.TarInfo]]]:
    """Stream a tar's samples: (key, {ext: bytes}, members in order). Not a tar: exit 2 naming the file. A
    member over :func:`max_tar_member` bytes is not read: its value is a :class:`TooLarge`. The first ``skip``
    samples are walked without reading their members (a resumed shard)."""
    try:
        tf = tarfile.open(path, mode="r|*")
    except (tarfile.TarError, OSError) as exc:
        raise UsageError(f"{path}: not a readable tar shard ({type(exc).__name__}: {exc})") from None
    key, sample, members = None, {}, []
    limit = max_tar_member()
    seen = 0
    try:
        with tf:
            for m in tf:
                if not m.isfile():
                    continue
                parts = split_name(m.name)
                if parts is None:
                    continue
                k, ext = parts
                if k != key and key is not None:
                    if seen >= skip:
                        yield key, sample, members
                    seen += 1
                    sample, members = {}, []
                key = k
                members.append(m)
                if seen < skip:
                    continue
                if m.size > limit:  # (a sparse member's size is its expanded size: checked before any read)
                    sample[ext] = TooLarge(m.name, m.size, limit)
                    continue
                fh = tf.extractfile(m)
                sample[ext] = fh.read() if fh is not None else b""
            if key is not None and seen >= skip:
                yield key, sample, members
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UsageError(f"{path}: the tar shard is truncated or corrupt ({type(exc).__name__}: {exc})") from None


def wds_value(sample: dict[str, bytes], column: str) -> tuple[Any, str | None]:
    """A WebDataset column: an extension (``png``, ``txt``) or a field of a json member (``json.caption``)."""
    if column in sample:
        if isinstance(sample[column], TooLarge):
            return None, sample[column].reason()
        return sample[column], None
    if "." in column:
        ext, fld = column.split(".", 1)
        if ext in sample:
            if isinstance(sample[ext], TooLarge):
                return None, sample[ext].reason()
            try:
                obj = json.loads(sample[ext])
            except ValueError as exc:
                return None, f"member .{ext} is not JSON ({exc})"
            if isinstance(obj, dict) and fld in obj:
                return obj[fld], None
            return None, f"member .{ext} has no field {fld!r}"
    return None, f"no member .{column} (has: {', '.join(sorted(sample)) or 'nothing'})"


def _wds_batches(shard: Shard, cols: Columns, batch_size: int, start: int = 0) -> Iterator[dict[str, list]]:
    ids, images, prompts, sources, errors = [], [], [], [], []
    for key, sample, _ in iter_wds_samples(shard.path, skip=start):
        err = None
        if cols.image:
            img, err = wds_value(sample, cols.image)
        else:
            ext = next((e for e in IMAGE_EXTS if e in sample), None)
            img = sample.get(ext) if ext else None
            err = None if ext else f"no image member ({'/'.join(IMAGE_EXTS)}; has: {', '.join(sorted(sample))})"
            if isinstance(img, TooLarge):
                img, err = None, img.reason()
        prompt = None
        if cols.prompt:
            prompt, perr = wds_value(sample, cols.prompt)
            prompt = prompt.decode("utf-8", errors="replace").strip() if isinstance(prompt, bytes) else prompt
            err = err or (f"prompt: {perr}" if perr else None)
        row_src = []
        for c in cols.sources:
            v, serr = wds_value(sample, c)
            err = err or (f"source: {serr}" if serr else None)
            row_src.append(v)
        rid = key
        if cols.id:
            v, ierr = wds_value(sample, cols.id)
            rid = v.decode("utf-8").strip() if isinstance(v, bytes) else (None if v is None else str(v))
            err = err or (f"id: {ierr}" if ierr else None)
        ids.append(rid)
        images.append(img)
        prompts.append(prompt)
        sources.append(row_src)
        errors.append(err)
        if len(ids) == batch_size:
            yield _batch(ids, images, prompts, sources if cols.sources else None, errors)
            ids, images, prompts, sources, errors = [], [], [], [], []
    if ids:
        yield _batch(ids, images, prompts, sources if cols.sources else None, errors)
