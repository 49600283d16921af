"""Keep the rows of a dataset that its scores select, written in the dataset's own format (``rewardkit filter``).

Selection, in order: rows invalid for any reward used are dropped; then ``where`` (an expression of
:mod:`.expr`) must hold; then ``top_k`` / ``top_p`` keep the best rows of each ``group_by`` group (the
whole set without one) by the ``by`` column, ties to the earlier row. Only score columns (small) are held in
memory; the data (images included) streams shard by shard into ``<shard>.parquet`` / ``<shard>.tar`` files,
or, for a Hugging Face dataset, ``Dataset.select(kept).save_to_disk``.

Score columns: with one scores folder, ``score``, ``valid``, ``error``, ``dim_<name>``; with named folders
(``{"hps": dir1, "aes": dir2}``) ``hps`` (the score), ``hps.valid``, ``hps.dim_<name>``, ... Any other name in
the expression or ``group_by`` is a column of the input data (``prompt`` is the prompt column the scores used).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import tarfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import UsageError
from .expr import parse_expression
from .output import MANIFEST, quarantined, read_scores
from .readers import TooLarge, iter_wds_samples, split_name, wds_value
from .sources import Dataset, open_dataset

REPORT = "_rewardkit_filter.json"


@dataclasses.dataclass
class FilterReport:
    """How many rows were kept, and why the others were dropped."""

    total: int = 0
    kept: int = 0
    invalid: int = 0
    failed_where: int = 0
    below_top: int = 0
    output: str = ""
    shards: int = 0
    quarantined: list = dataclasses.field(default_factory=list)  # shards left out when scored (no scores)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _load_scores(scores: Any, ds: Dataset, want: set[str] | None = None
                 ) -> tuple[dict[str, Any], list[str], dict[str, Any], dict[str, int], set[str]]:
    """name -> numpy column for the score columns in ``want`` (all with None) and every validity column; the
    validity columns; the (first) manifest; rows per shard; the shards left out by ``--skip-bad-shards``.
    Only these columns are read: no ids, rows or shard names per row (the memory of ``--group-by`` on
    millions of rows)."""
    import numpy as np
    import pyarrow.parquet as pq

    named = {"": scores} if isinstance(scores, (str, os.PathLike)) else dict(scores)
    cols: dict[str, Any] = {}
    valids: list[str] = []
    first: dict[str, Any] = {}
    sizes: dict[str, int] | None = None
    left_out: set[str] = set()
    for name, folder in named.items():
        pre = f"{name}." if name else ""
        man_path = Path(folder) / MANIFEST
        if not man_path.exists():
            read_scores(Path(folder))  # the "not a scores folder" message
        man = json.loads(man_path.read_text(encoding="utf-8"))
        first = first or man
        if man.get("shards") != [s.name for s in ds.shards]:
            raise UsageError(f"{folder}: scores of shards {man.get('shards')[:3]}... do not match the dataset's "
                             f"{[s.name for s in ds.shards][:3]}... (score this dataset into its own folder)")
        bad = {q["shard"] for q in quarantined(Path(folder))}
        left_out |= bad
        files = [(n, Path(folder) / f"{n}.parquet") for n in man["shards"] if n not in bad]
        for n, f in files:
            if not f.exists():
                read_scores(Path(folder))  # the "did not finish" message, naming the shard
        if not files:
            raise UsageError(f"{folder}: no shard has scores (every one quarantined)")
        names = pq.read_schema(files[0][1]).names
        key_of = {c: (name if (name and c == "score") else pre + c) for c in names
                  if c not in ("shard", "row", "error", "rationale")}
        read = [c for c, k in key_of.items() if c == "valid" or want is None or k in want]
        here = {n: pq.ParquetFile(f).metadata.num_rows for n, f in files}
        if sizes is not None and sum(sizes.values()) != sum(here.values()):
            raise UsageError(f"{folder}: {sum(here.values())} score rows but {sum(sizes.values())} in the first "
                             "scores folder (scored on different data?)")
        sizes = sizes if sizes is not None else here
        parts: dict[str, list] = {c: [] for c in read}
        for _, f in files:
            t = pq.read_table(f, columns=read)
            for c in read:
                parts[c].append(t.column(c).to_numpy(zero_copy_only=False))
        for c in read:
            cols[key_of[c]] = np.concatenate(parts[c]) if parts[c] else np.zeros(0)
        valids.append(pre + "valid")
    return cols, valids, first, sizes or {}, left_out


def _input_columns(ds: Dataset, names: Sequence[str], prompt_col: str | None, skip: set[str] = frozenset(),
                   codes: Sequence[str] = ()) -> dict[str, Any]:
    """Columns of the input data (``prompt`` = the prompt column of the scores) read for every row, in order
    (shards in ``skip`` left out). A column in ``codes`` (only grouped by) is held as integer group codes, not
    its values."""
    import numpy as np

    want = {n: (prompt_col if n == "prompt" and prompt_col else n) for n in names}
    out: dict[str, list] = {n: [] for n in names}
    index: dict[str, dict[Any, int]] = {n: {} for n in codes}

    def add(n: str, vals: list) -> None:
        if n in index:
            ix = index[n]
            out[n].append(np.fromiter((ix.setdefault(v, len(ix)) for v in vals), dtype=np.int64, count=len(vals)))
        else:
            out[n] += vals

    for shard in ds.shards:
        if shard.name in skip:
            continue
        if ds.format == "parquet":
            import pyarrow.parquet as pq

            have = pq.read_schema(shard.path).names
            for n, c in want.items():
                if c not in have:
                    raise UsageError(f"{shard.path}: no column {c!r} for {n!r} (columns: {', '.join(have)})")
            t = pq.read_table(shard.path, columns=list(dict.fromkeys(want.values())))
            for n, c in want.items():
                add(n, t.column(c).to_pylist())
        elif ds.format == "hf":
            part = ds.hf.select(range(shard.start, shard.stop))
            for n, c in want.items():
                if c not in part.column_names:
                    raise UsageError(f"{shard.path}: no column {c!r} (columns: {', '.join(part.column_names)})")
                add(n, list(part[c]))
        else:
            vals: dict[str, list] = {n: [] for n in want}
            for key, sample, _ in iter_wds_samples(shard.path):
                for n, c in want.items():
                    v, _err = wds_value(sample, c)
                    vals[n].append(v.decode("utf-8", "replace").strip() if isinstance(v, bytes) else v)
            for n in want:
                add(n, vals[n])
    res = {}
    for n, v in out.items():
        if n in index:
            res[n] = np.concatenate(v) if v else np.zeros(0, dtype=np.int64)
            continue
        vals = [x for x in v if x is not None]
        if vals and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
            # numbers with nulls: float with NaN, as pandas reads the column
            res[n] = np.asarray([np.nan if x is None else x for x in v], dtype=None if len(vals) == len(v)
                                else np.float64)
        else:
            res[n] = np.asarray(v, dtype=object)
    return res


def select(cols: Mapping[str, Any], valids: Sequence[str], where: str | None = None, top_k: int | None = None,
           top_p: float | None = None, group_by: str | None = None, by: str = "score", lowest: bool = False):
    """The keep mask over all rows, and the counts (invalid, failed_where, below_top). Pure numpy."""
    import numpy as np

    n = len(cols[valids[0]])
    valid = np.ones(n, dtype=bool)
    for v in valids:
        valid &= np.asarray(cols[v], dtype=bool)
    keep = valid.copy()
    if where is not None:
        rows = np.flatnonzero(valid)  # the expression never sees a row that is dropped anyway (invalid)
        cond = np.zeros(n, dtype=bool)
        cond[rows] = parse_expression(where).evaluate(cols, rows=rows)
        failed = int((keep & ~cond).sum())
        keep &= cond
    else:
        failed = 0
    before = int(keep.sum())
    if top_k is not None or top_p is not None:
        if by not in cols:
            raise UsageError(f"--by {by}: no such score column (columns: {', '.join(sorted(cols))})")
        key = np.asarray(cols[by], dtype=np.float64)
        g = np.asarray(cols[group_by]) if group_by else np.zeros(n, dtype=np.int64)
        groups = g if g.dtype.kind in "iu" else np.asarray(g, dtype=object)  # integer codes stay 8 bytes a row
        idx = np.flatnonzero(keep)
        order = idx[np.argsort(key[idx] if lowest else -key[idx], kind="stable")]  # ties: earlier row first
        taken: dict[Any, int] = {}
        sizes: dict[Any, int] = {}
        for i in idx:
            sizes[groups[i]] = sizes.get(groups[i], 0) + 1
        top = np.zeros(n, dtype=bool)
        for i in order:
            g = groups[i]
            limit = sizes[g] if top_k is None else top_k
            if top_p is not None:
                limit = min(limit, math.ceil(top_p * sizes[g] - 1e-9))
            if taken.get(g, 0) < limit:
                taken[g] = taken.get(g, 0) + 1
                top[i] = True
        keep &= top
    return keep, {"invalid": int((~valid).sum()), "failed_where": failed, "below_top": before - int(keep.sum())}


def filter_dataset(dataset: Any, scores: Any, output: str | Path, *, where: str | None = None,
                   top_k: int | None = None, top_p: float | None = None, group_by: str | None = None,
                   by: str | None = None, lowest: bool = False, format: str | None = None, split: str | None = None,
                   progress: bool = True) -> FilterReport:
    """Write the rows of ``dataset`` that ``scores`` select to ``output``, in the dataset's format.

    Args:
        dataset: the dataset the scores were computed on (same paths as given to ``score_dataset``).
        scores: a scores folder, or ``{name: folder}`` for several rewards (columns ``name``, ``name.valid``...).
        where: an expression (``"score >= 6.5"``, ``"hps > 0.25 and aes > 5"``); see :mod:`.expr`.
        top_k / top_p: keep the best k rows / the best fraction p (rounded up) of each ``group_by`` group.
        by: the column ranked by top-k / top-p (default ``score``, or the first named reward); ``lowest``
            ranks ascending (for lower-is-better rewards).
    """
    import numpy as np

    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise UsageError("--where is empty: give a condition such as 'score >= 6.5' (or leave --where out)")
    if top_k is not None and top_k < 1:
        raise UsageError("--top-k must be >= 1")
    if top_p is not None and not 0 < top_p <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    if isinstance(scores, (str, os.PathLike)):
        man = json.loads((Path(scores) / MANIFEST).read_text()) if (Path(scores) / MANIFEST).exists() else {}
    else:
        first = next(iter(dict(scores).values()))
        man = json.loads((Path(first) / MANIFEST).read_text()) if (Path(first) / MANIFEST).exists() else {}
    ds = open_dataset(dataset, format=format or man.get("format"), split=split or man.get("split"),
                      num_shards=len(man["shards"]) if man.get("format") == "hf" else None)
    needed = list(parse_expression(where).columns) if where else []
    ranked = top_k is not None or top_p is not None
    by = by or ("score" if isinstance(scores, (str, os.PathLike)) else next(iter(dict(scores))))
    want = set(needed) | ({by} if ranked else set()) | ({group_by} if group_by else set())
    cols, valids, man, sizes, left_out = _load_scores(scores, ds, want)
    extra = [c for c in needed + ([group_by] if group_by else []) if c not in cols]
    if extra:
        codes = [group_by] if group_by in extra and group_by not in needed else []
        cols.update(_input_columns(ds, list(dict.fromkeys(extra)), man.get("columns", {}).get("prompt"),
                                   skip=left_out, codes=codes))
    keep, counts = select(cols, valids, where, top_k, top_p, group_by, by, lowest)
    report = FilterReport(total=len(keep), kept=int(keep.sum()), output=str(output), shards=len(ds.shards),
                          quarantined=sorted(left_out), **counts)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm

    start = 0
    for shard in tqdm(ds.shards, desc="writing kept rows", unit="shard", disable=not progress):
        if shard.name in left_out:  # quarantined when scored: no row of it has a score, none is kept
            continue
        n = sizes.get(shard.name, 0)
        _write_shard(ds, shard, keep[start:start + n], out)
        start += n
    if ds.format == "hf":
        rows = np.concatenate([np.arange(s.start, s.stop) for s in ds.shards if s.name not in left_out])
        ds.hf.select(rows[keep].tolist()).save_to_disk(str(out / "data"))
    (out / REPORT).write_text(json.dumps({**report.as_dict(), "where": where, "top_k": top_k, "top_p": top_p,
                                          "group_by": group_by, "by": by, "scores": str(scores)}, indent=2))
    return report


def _write_shard(ds: Dataset, shard: Any, mask: Any, out: Path) -> None:
    if ds.format == "hf":
        return  # one save_to_disk for the whole selection
    if ds.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(shard.path)
        if pf.metadata.num_rows != len(mask):
            raise UsageError(f"{shard.path}: {pf.metadata.num_rows} rows but {len(mask)} scores (the data changed "
                             "since it was scored; rescore with --overwrite)")
        final = out / f"{shard.name}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        with pq.ParquetWriter(str(tmp), pf.schema_arrow) as w:
            pos = 0
            for rb in pf.iter_batches(batch_size=1024):
                m = mask[pos:pos + rb.num_rows]
                pos += rb.num_rows
                if m.any():
                    w.write_table(pa.Table.from_batches([rb.filter(pa.array(m))], schema=pf.schema_arrow))
        os.replace(tmp, final)
        return
    final = out / f"{shard.name}.tar"
    tmp = final.with_name(final.name + ".tmp")
    pos = 0
    with tarfile.open(tmp, "w") as tf:
        for _key, sample, members in iter_wds_samples(shard.path):
            if pos >= len(mask):
                raise UsageError(f"{shard.path}: more samples than scores (the shard changed since it was scored)")
            if bool(mask[pos]):
                for m in members:
                    data = sample[split_name(m.name)[1]]
                    if isinstance(data, TooLarge):  # a kept sample with a member past the read limit
                        raise UsageError(f"{shard.path}: kept sample {_key!r}: {data.reason()}; raise "
                                         "REWARDKIT_MAX_TAR_MEMBER to copy it")
                    tf.addfile(m, io.BytesIO(data))
            pos += 1
    if pos != len(mask):
        raise UsageError(f"{shard.path}: {pos} samples but {len(mask)} scores (the shard changed since it was scored)")
    os.replace(tmp, final)
