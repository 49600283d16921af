"""Score shards on disk: one Parquet file per input shard, written atomically, plus a resume manifest.

An output folder holds ``<shard>.parquet`` for every finished shard and ``_rewardkit_scores.json``, the
manifest: the reward (name, configuration, rewardkit version), its fingerprint, the input and the column
mapping. A shard is written to ``<shard>.parquet.tmp`` and renamed when its last row is written, so a file
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
    cfg = json.loads(json.dumps(cfg, default=str))
    stable = {k: v for k, v in cfg.items() if k not in _DEVICE_KEYS}
    key = {"reward": reward.name or type(reward).__name__, "config": stable, "columns": columns,
           "rewardkit": __version__}
    fp = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return {"reward": key["reward"], "config": cfg, "rewardkit_version": __version__, "columns": columns,
            "fingerprint": fp}


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
            what = []
            if old.get("reward") != desc["reward"]:
                what.append(f"reward {old.get('reward')!r} -> {desc['reward']!r}")
            if changed:
                what.append("config " + ", ".join(changed))
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
        for f in out_dir.glob("*.parquet"):
            f.unlink()
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


class ShardWriter:
    """Stream one shard's scores to ``<name>.parquet.tmp``; :meth:`commit` renames it to ``<name>.parquet``."""

    def __init__(self, out_dir: Path, shard_name: str, shard_path: str, desc: dict[str, Any], id_type: Any,
                 dimensions: list[str]):
        import pyarrow as pa

        self.final = out_dir / f"{shard_name}.parquet"
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.final.with_name(self.final.name + ".tmp")
        self.shard_name = shard_name
        self.dimensions = list(dimensions)
        self.rationale = False
        fields = [("shard", pa.string()), ("row", pa.int64()), ("id", id_type), ("score", pa.float64()),
                  ("valid", pa.bool_()), ("error", pa.string())]
        fields += [(dim_column(d), pa.float64()) for d in self.dimensions]
        self._fields = fields
        self._meta = {META_KEY: json.dumps({**desc, "input_shard": shard_path}).encode()}
        self._writer = None
        self._pending: list[Any] = []  # score rows are small: buffer them into row groups of ROW_GROUP rows
        self._pending_rows = 0
        self.rows = 0
        self.invalid = 0

    def _open(self, with_rationale: bool):
        import pyarrow as pa
        import pyarrow.parquet as pq

        fields = list(self._fields) + ([("rationale", pa.string())] if with_rationale else [])
        self.rationale = with_rationale
        self.schema = pa.schema(fields, metadata=self._meta)
        self._writer = pq.ParquetWriter(str(self.tmp), self.schema)

    def write(self, ids: list[Any], records: list[dict[str, Any]]) -> None:
        """Append rows (``records`` as :meth:`RewardOutput.records` gives them, in row order)."""
        import pyarrow as pa

        if self._writer is None:
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

        if self._pending:
            self._writer.write_table(pa.concat_tables(self._pending), row_group_size=ROW_GROUP)
            self._pending, self._pending_rows = [], 0

    def commit(self) -> None:
        if self._writer is None:
            self._open(False)
        self._flush()
        self._writer.close()
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()


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
    """All score files of a folder (in shard order of the manifest) as one ``pyarrow.Table``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    man = out_dir / MANIFEST
    if not man.exists():
        raise UsageError(f"{out_dir}: not a scores folder (no {MANIFEST}; write one with `rewardkit score "
                         "--dataset ... --output DIR`)")
    meta = json.loads(man.read_text(encoding="utf-8"))
    tables = []
    for name in meta.get("shards", []):
        path = out_dir / f"{name}.parquet"
        if not path.exists():
            raise UsageError(f"{out_dir}: shard {name} has no scores yet (the scoring run did not finish; rerun "
                             "`rewardkit score` with the same --output to resume)")
        tables.append(pq.read_table(path, columns=columns))
    return pa.concat_tables(tables) if tables else None, meta
