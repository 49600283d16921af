"""Score shards on disk: one Parquet file per input shard, written atomically, plus a resume manifest.

An output folder holds ``<shard>.parquet`` for every finished shard and ``_rewardkit_scores.json``, the
manifest: the reward (name, configuration, rewardkit version), its fingerprint, the input and the column
mapping. The fingerprint hashes the **content** of every local file / folder the configuration names
(:mod:`rewardkit.fingerprint`), not the path: new weights at the same path are refused, an equal checkpoint
copied to another path resumes. A shard is written to ``<shard>.parquet.tmp`` and renamed when its last row is written, so a file
with the final name is always complete: a rerun skips it and redoes only the shards without one. A rerun
with a different reward (or configuration, or column mapping) is refused: its scores would mix with the old.

Every score file has the columns ``shard``, ``row`` (position in the input shard), ``id``, ``score``
(float64; NaN when invalid), ``valid``, ``error`` and one float64 ``dim_<name>`` per dimension (``rationale``
for judges), and the manifest's reward description in its Parquet metadata under the key ``rewardkit``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import UsageError

MANIFEST = "_rewardkit_scores.json"
META_KEY = b"rewardkit"
_DEVICE_KEYS = ("device",)  # where a reward runs does not change what it computes
ROW_GROUP = 16384  # rows per row group of a score file (one per batch would make millions of tiny groups)


def dim_column(name: str) -> str:
    """The column of a dimension: ``dim_`` + the name with anything but letters, digits and ``_`` as ``_``."""
    return "dim_" + re.sub(r"\W", "_", name)


def reward_description(reward: Any, columns: dict[str, Any]) -> dict[str, Any]:
    """Name, configuration, version and the fingerprint that decides whether old scores may be reused."""
    from .._version import __version__
    from ..reward import config_dict

    try:
        cfg = config_dict(reward)
    except Exception:  # noqa: BLE001  a reward without a dataclass config (composite, remote)
        cfg = {"repr": repr(reward)}
    from ..fingerprint import content_config, default_memo_dir

    cfg = json.loads(json.dumps(cfg, default=str))
    stable = {k: v for k, v in cfg.items() if k not in _DEVICE_KEYS}
    # the weights' content, not the path string: new weights at the same path re-key, a copy elsewhere does not
    content = content_config(stable, default_memo_dir())
    key = {"reward": reward.name or type(reward).__name__, "config": content, "columns": columns,
           "rewardkit": __version__}
    fp = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return {"reward": key["reward"], "config": cfg, "rewardkit_version": __version__, "columns": columns,
            "content": {k: v for k, v in content.items() if v != stable.get(k)}, "fingerprint": fp}


def check_manifest(out_dir: Path, desc: dict[str, Any], extra: dict[str, Any], overwrite: bool = False,
                   write: bool = True) -> None:
    """Refuse an output folder holding another reward's scores; write the manifest (idempotent) when ``write``
    (only rank 0 writes under torchrun; every rank checks)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / MANIFEST
    if path.exists() and not overwrite:
        old = json.loads(path.read_text(encoding="utf-8"))
        if old.get("fingerprint") != desc["fingerprint"]:
            changed = sorted(k for k in set(old.get("config", {})) | set(desc["config"])
                             if old.get("config", {}).get(k) != desc["config"].get(k) and k not in _DEVICE_KEYS)
            oc, nc = old.get("content", {}), desc.get("content", {})
            weights = sorted(k for k in set(oc) | set(nc) if oc.get(k) != nc.get(k))
            what = []
            if old.get("reward") != desc["reward"]:
                what.append(f"reward {old.get('reward')!r} -> {desc['reward']!r}")
            if changed:
                what.append("config " + ", ".join(changed))
            for k in weights:
                what.append(f"the weights {k} names ({desc['config'].get(k)}) are not the ones scored before "
                            f"({oc.get(k, 'no content recorded')} -> {nc.get(k, 'not a local path')})")
            if old.get("columns") != desc["columns"]:
                what.append("columns")
            if old.get("rewardkit_version") != desc["rewardkit_version"]:
                what.append(f"rewardkit {old.get('rewardkit_version')} -> {desc['rewardkit_version']}")
            raise UsageError(f"{out_dir} holds scores of a different reward ({'; '.join(what) or 'fingerprint'}: "
                             f"{old.get('fingerprint')} vs {desc['fingerprint']}); its finished shards cannot be "
                             "reused. Use another --output folder (or --overwrite to rescore every shard)")
    if not write:
        return
    if overwrite:
        import shutil

        for f in out_dir.glob("*.parquet"):
            f.unlink()
        for d in (PARTIAL, QUARANTINE):
            shutil.rmtree(out_dir / d, ignore_errors=True)
    tmp = path.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**desc, **extra}, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def finished(out_dir: Path, shard_name: str, desc: dict[str, Any]) -> bool:
    """True when the shard's final file exists (and was written by this reward)."""
    path = out_dir / f"{shard_name}.parquet"
    if not path.exists():
        return False
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    got = json.loads(meta.get(META_KEY, b"{}")).get("fingerprint")
    if got != desc["fingerprint"]:
        raise UsageError(f"{path}: written by another reward (fingerprint {got} vs {desc['fingerprint']}); "
                         "remove it or use another --output folder")
    return True


PARTIAL = "_partial"  # <output>/_partial/<shard>/<k>.parquet: the committed row groups of unfinished shards
QUARANTINE = "_quarantine"  # <output>/_quarantine/<shard>.json: a shard --skip-bad-shards left out, and why


def partial_dir(out_dir: Path, shard_name: str) -> Path:
    return out_dir / PARTIAL / shard_name


def _fingerprint_of(path: Path) -> Any:
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta.get(META_KEY, b"{}")).get("fingerprint")


def partial_parts(out_dir: Path, shard_name: str, desc: dict[str, Any]) -> list[Path]:
    """The committed row-group files of an interrupted shard, in order; one written by another reward is
    refused (exit 2) like a finished shard of another reward."""
    d = partial_dir(out_dir, shard_name)
    parts = sorted(d.glob("*.parquet")) if d.is_dir() else []
    for part in parts:
        got = _fingerprint_of(part)
        if got != desc["fingerprint"]:
            raise UsageError(f"{part}: rows of shard {shard_name} scored by another reward (fingerprint {got} vs "
                             f"{desc['fingerprint']}); remove {d} or use another --output folder")
    return parts


def partial_rows(out_dir: Path, shard_name: str, desc: dict[str, Any]) -> int:
    """Rows of ``shard_name`` already committed by an interrupted run (where its resume starts)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in partial_parts(out_dir, shard_name, desc))


def quarantine(out_dir: Path, shard_name: str, shard_path: str, reason: str) -> None:
    """Record that ``--skip-bad-shards`` left ``shard_name`` out (read back by :func:`quarantined`)."""
    d = out_dir / QUARANTINE
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{shard_name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"shard": shard_name, "path": shard_path, "reason": reason}), encoding="utf-8")
    os.replace(tmp, d / f"{shard_name}.json")


def unquarantine(out_dir: Path, shard_name: str) -> None:
    try:
        (out_dir / QUARANTINE / f"{shard_name}.json").unlink()
    except FileNotFoundError:
        pass


def quarantined(out_dir: Path) -> list[dict[str, Any]]:
    """The shards left out by ``--skip-bad-shards`` (and not scored since), each ``{shard, path, reason}``."""
    d = out_dir / QUARANTINE
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        rec = json.loads(f.read_text(encoding="utf-8"))
        if not (out_dir / f"{rec['shard']}.parquet").exists():
            out.append(rec)
    return out


def record_quarantine(out_dir: Path) -> list[dict[str, Any]]:
    """Write the quarantined shards into the manifest (``quarantined``) and return them."""
    path = out_dir / MANIFEST
    bad = quarantined(out_dir)
    man = json.loads(path.read_text(encoding="utf-8"))
    man["quarantined"] = bad
    tmp = path.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(man, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    return bad


class ShardWriter:
    """Stream one shard's scores in row groups of :data:`ROW_GROUP` rows, each committed to its own file under
    ``_partial/<shard>/`` (written then renamed, so a kill leaves only whole row groups); :meth:`commit` joins
    them into ``<name>.parquet``. An interrupted shard resumes after its last committed row group: ``rows``
    starts at the rows already there (:func:`partial_rows`)."""

    def __init__(self, out_dir: Path, shard_name: str, shard_path: str, desc: dict[str, Any], id_type: Any,
                 dimensions: list[str]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.final = out_dir / f"{shard_name}.parquet"
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.final.with_name(self.final.name + ".tmp")
        self.parts_dir = partial_dir(out_dir, shard_name)
        self.shard_name = shard_name
        self.dimensions = list(dimensions)
        self.rationale = False
        fields = [("shard", pa.string()), ("row", pa.int64()), ("id", id_type), ("score", pa.float64()),
                  ("valid", pa.bool_()), ("error", pa.string())]
        fields += [(dim_column(d), pa.float64()) for d in self.dimensions]
        self._fields = fields
        self._meta = {META_KEY: json.dumps({**desc, "input_shard": shard_path}).encode()}
        self.schema = None
        self._pending: list[Any] = []  # score rows are small: buffer them into row groups of ROW_GROUP rows
        self._pending_rows = 0
        self.parts = partial_parts(out_dir, shard_name, desc)
        self.resumed = sum(pq.ParquetFile(p).metadata.num_rows for p in self.parts)
        if self.parts:  # the schema the interrupted run chose (with or without a rationale column)
            self._open("rationale" in pq.read_schema(self.parts[0]).names)
        self.rows = self.resumed
        self.invalid = 0

    def _open(self, with_rationale: bool):
        import pyarrow as pa

        fields = list(self._fields) + ([("rationale", pa.string())] if with_rationale else [])
        self.rationale = with_rationale
        self.schema = pa.schema(fields, metadata=self._meta)

    def write(self, ids: list[Any], records: list[dict[str, Any]]) -> None:
        """Append rows (``records`` as :meth:`RewardOutput.records` gives them, in row order)."""
        import pyarrow as pa

        if self.schema is None:
            self._open(any("rationale" in r for r in records))
        n = len(records)
        nan = float("nan")
        cols: dict[str, list] = {
            "shard": [self.shard_name] * n, "row": list(range(self.rows, self.rows + n)), "id": list(ids),
            "score": [nan if r["score"] is None else float(r["score"]) for r in records],
            "valid": [bool(r["valid"]) for r in records], "error": [r["error"] for r in records]}
        for d in self.dimensions:
            vals = [(r.get("dimensions") or {}).get(d) for r in records]
            cols[dim_column(d)] = [nan if v is None else float(v) for v in vals]
        if self.rationale:
            cols["rationale"] = [r.get("rationale") for r in records]
        try:
            table = pa.Table.from_pydict(cols, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise UsageError(f"shard {self.shard_name}: an id cannot be stored as {self.schema.field('id').type} "
                             f"({exc})") from None
        self._pending.append(table)
        self._pending_rows += n
        if self._pending_rows >= ROW_GROUP:
            self._flush()
        self.rows += n
        self.invalid += sum(not r["valid"] for r in records)

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._pending:
            self.parts_dir.mkdir(parents=True, exist_ok=True)
            part = self.parts_dir / f"{len(self.parts):08d}.parquet"
            tmp = part.with_name(part.name + ".tmp")
            pq.write_table(pa.concat_tables(self._pending), str(tmp), row_group_size=ROW_GROUP)
            os.replace(tmp, part)
            self.parts.append(part)
            self._pending, self._pending_rows = [], 0

    def commit(self) -> None:
        import shutil

        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.schema is None:
            self._open(False)
        with pq.ParquetWriter(str(self.tmp), self.schema) as w:
            for part in self.parts:  # each committed group as it was flushed: the bytes of an unbroken run
                w.write_table(pq.read_table(part).replace_schema_metadata(self.schema.metadata),
                              row_group_size=ROW_GROUP)
            if self._pending:
                w.write_table(pa.concat_tables(self._pending), row_group_size=ROW_GROUP)
        os.replace(self.tmp, self.final)
        self._pending, self._pending_rows = [], 0
        shutil.rmtree(self.parts_dir, ignore_errors=True)
        try:
            self.parts_dir.parent.rmdir()  # the last unfinished shard done: no empty _partial folder stays
        except OSError:
            pass

    def abort(self) -> None:
        """Keep the committed row groups (a rerun resumes after them); rows not yet in one are scored again."""
        self._pending, self._pending_rows = [], 0


class AtomicParquet:
    """A Parquet file written batch by batch to ``<final>.tmp`` and renamed to ``final`` by :meth:`commit`."""

    def __init__(self, final: Path, schema: Any):
        import pyarrow.parquet as pq

        self.final, self.schema = Path(final), schema
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.final.with_name(self.final.name + ".tmp")
        self._writer = pq.ParquetWriter(str(self.tmp), schema)
        self.rows = 0

    def write(self, cols: dict[str, list]) -> None:
        import pyarrow as pa

        table = pa.Table.from_pydict(cols, schema=self.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def commit(self) -> None:
        self._writer.close()
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        self._writer.close()


def read_scores(out_dir: Path, columns: list[str] | None = None) -> Any:
    """All score files of a folder (in shard order of the manifest): ``(table, manifest)``, one ``pyarrow.Table``
    and the manifest's dict, with ``"quarantined"`` listing the shards left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    man = out_dir / MANIFEST
    if not man.exists():
        raise UsageError(f"{out_dir}: not a scores folder (no {MANIFEST}; write one with `rewardkit score "
                         "--dataset ... --output DIR`)")
    meta = json.loads(man.read_text(encoding="utf-8"))
    left_out = {q["shard"] for q in quarantined(out_dir)}
    meta["quarantined"] = sorted(left_out)
    tables = []
    for name in meta.get("shards", []):
        path = out_dir / f"{name}.parquet"
        if name in left_out:  # --skip-bad-shards left it out: none of its rows has a score
            continue
        if not path.exists():
            raise UsageError(f"{out_dir}: shard {name} has no scores yet (the scoring run did not finish; rerun "
                             "`rewardkit score` with the same --output to resume)")
        tables.append(pq.read_table(path, columns=columns))
    return pa.concat_tables(tables) if tables else None, meta
