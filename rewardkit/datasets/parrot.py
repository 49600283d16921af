"""PARROT stage 1 (anchored rationales) over a sharded dataset of preference pairs, resumable, locally or on Ray.

The teacher runs over every pair of a Parquet / WebDataset / Hugging Face dataset, shard by shard, through the
same machinery as :func:`~rewardkit.datasets.score_dataset`: one Parquet file of rationale records per input
shard (written to ``.tmp`` and renamed when the shard is done), a manifest whose fingerprint (teacher,
template, seed, columns) refuses a different teacher, and ``--engine ray``-style execution where actors hold
the teacher. Records are those of :meth:`rewardkit.parrot.pipeline.Pipeline.rationale_records` (``status``
ok / unparseable / judge_failure / skipped, ``reason``, ``dimension``, ``rationale``, ``rationale_preferred``,
``raw``) plus ``shard``, ``row`` and ``id``; the wall-clock ``time`` of the JSONL stage is left out so a rerun
writes the same bytes.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from .output import AtomicParquet, META_KEY, check_manifest, finished, reward_description
from .readers import iter_columns, shard_base
from .scoring import ScoreSummary, manifest_extra
from .sources import Dataset, open_dataset

FIELDS = (("status", "string"), ("reason", "string"), ("dimension", "string"), ("rationale", "string"),
          ("rationale_preferred", "string"), ("raw", "string"), ("label", "string"), ("prompt", "string"),
          ("task", "string"), ("teacher", "string"), ("template", "string"), ("seed", "int64"))


@dataclasses.dataclass
class PairColumns:
    image_a: str = "image_a"
    image_b: str = "image_b"
    prompt: str = "prompt"
    label: str = "label"
    source: str | None = None
    id: str | None = None

    def names(self) -> list[str]:
        return [c for c in (self.image_a, self.image_b, self.prompt, self.label, self.source, self.id) if c]


@dataclasses.dataclass
class _Teacher:
    """What the manifest records about stage 1 (no model loaded)."""

    name: str
    config: dict[str, Any]


def _pipeline(cfg: Any, teacher: Any = None) -> Any:
    from ..parrot.pipeline import Pipeline

    return Pipeline(cfg, teacher=teacher, progress=False, load_data=False)


def pair_rows(ds: Dataset, shard: Any, cols: PairColumns, batch_size: int):
    """Yield ``(start, ids, rows, errors)``: the stage-1 rows of a shard a batch at a time (images decoded)."""
    from .. import media
    from ..train.data import normalize_label
    from ..train.losses import LABEL_A, LABEL_B
    from .readers import resolve_image

    base = shard_base(ds, shard)
    id_col = cols.id or ("__key__" if ds.format == "webdataset" else None)
    start = 0
    for vals, errs in iter_columns(ds, shard, cols.names() + ([id_col] if id_col else []), batch_size):
        n = len(errs)
        rows, ids = [], []
        for i in range(n):
            ids.append(str(vals[id_col][i]) if id_col else f"{shard.name}:{start + i}")
            err = errs[i]
            row: dict[str, Any] = {"row": start + i, "prompt": vals[cols.prompt][i], "sources": []}
            try:
                if err is None:
                    lab = normalize_label(_text(vals[cols.label][i]))
                    row["label"] = "A" if lab == LABEL_A else "B" if lab == LABEL_B else "tie"
                    row["prompt"] = _text(row["prompt"])
                    for slot in ("image_a", "image_b") + (("source",) if cols.source else ()):
                        img, e = resolve_image(vals[getattr(cols, slot)][i], base)
                        if e:
                            raise ValueError(f"{getattr(cols, slot)}: {e}")
                        pil = media.to_pil(img)
                        if slot == "source":
                            row["sources"] = [pil]
                        else:
                            row[slot] = pil
            except Exception as exc:  # noqa: BLE001  a bad row is that row's record, never the run's end
                err = f"{type(exc).__name__}: {exc}"
            errs[i] = err
            rows.append(row)
        yield start, ids, rows, errs
        start += n


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace").strip() if isinstance(v, bytes) else v


def rationale_batch(pipe: Any, rows: list[dict[str, Any]], errs: list[str | None]) -> list[dict[str, Any]]:
    """Stage-1 records for a batch; rows that could not be read are ``skipped`` with their reason."""
    ok = [j for j, e in enumerate(errs) if e is None]
    recs = pipe.rationale_records([rows[j] for j in ok]) if ok else []
    out: list[dict[str, Any]] = []
    it = iter(recs)
    for j, e in enumerate(errs):
        if e is None:
            out.append(next(it))
        else:
            out.append({"row": rows[j]["row"], "status": "skipped", "reason": f"unreadable row: {e}",
                        "prompt": rows[j].get("prompt") if isinstance(rows[j].get("prompt"), str) else None,
                        "label": rows[j].get("label")})
    return out


def _schema(desc: dict[str, Any], shard_path: str) -> Any:
    import json

    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64()}
    fields = [("shard", pa.string()), ("row", pa.int64()), ("id", pa.string())]
    fields += [(k, types[t]) for k, t in FIELDS]
    return pa.schema(fields, metadata={META_KEY: json.dumps({**desc, "input_shard": shard_path}).encode()})


def _columns(shard_name: str, ids: list[str], recs: list[dict[str, Any]]) -> dict[str, list]:
    cols: dict[str, list] = {"shard": [shard_name] * len(recs), "row": [r["row"] for r in recs], "id": list(ids)}
    for k, t in FIELDS:
        vals = [r.get(k) for r in recs]
        cols[k] = [None if v is None else (int(v) if t == "int64" else str(v)) for v in vals]
    return cols


def rationalize_dataset(cfg: Any, dataset: Any, output: str | Path, *, columns: PairColumns | None = None,
                        teacher: Any = None, format: str | None = None, split: str | None = None,
                        num_shards: int | None = None, batch_size: int | None = None, overwrite: bool = False,
                        engine: str = "local", address: str | None = None, concurrency: int = 1,
                        num_gpus: float | None = None) -> ScoreSummary:
    """PARROT stage 1 over every pair of ``dataset`` into ``output/<shard>.parquet`` (resumable per shard).

    Args:
        cfg: a :class:`~rewardkit.parrot.pipeline.ParrotConfig` (its ``teacher``, ``template``, ``seed`` and
            ``batch_size`` are used; ``output_dir`` holds the teacher's scratch files, e.g. a tiny checkpoint).
        dataset: Parquet / WebDataset / Hugging Face pairs (see :func:`~rewardkit.datasets.open_dataset`).
        columns: which columns hold image A / B, the prompt, the label (A / B / tie and aliases), an optional
            source image and id.
        teacher: a ready judge backend (local engine only; default: built from ``cfg.teacher``).
        engine: ``"local"`` or ``"ray"`` (``concurrency`` actors, each with its own teacher, ``num_gpus`` each).
    """
    cols = columns or PairColumns()
    batch_size = batch_size or int(cfg.batch_size)
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, format=format, split=split,
                                                                   num_shards=num_shards)
    desc = reward_description(_Teacher("parrot.rationalize", {"teacher": dataclasses.asdict(cfg.teacher),
                                                              "template": cfg.template, "seed": cfg.seed}),
                              dataclasses.asdict(cols))
    out = Path(output)
    check_manifest(out, desc, manifest_extra(ds), overwrite=overwrite)
    todo = [i for i, s in enumerate(ds.shards) if not finished(out, s.name, desc)]
    summary = ScoreSummary(output=str(out), shards_skipped=len(ds.shards) - len(todo))
    t0 = time.perf_counter()
    if engine == "ray":
        results = _ray_results(cfg, ds, todo, cols, batch_size, address, concurrency, num_gpus)
    elif engine == "local":
        pipe = _pipeline(cfg, teacher)
        results = ((ds.shards[i].name, s, ids, rationale_batch(pipe, rows, errs))
                   for i in todo for s, ids, rows, errs in pair_rows(ds, ds.shards[i], cols, batch_size))
    else:
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    queue = [ds.shards[i] for i in todo]
    writer = None
    try:
        for shard_name, start, ids, recs in results:
            while writer is None or writer.final.stem != shard_name:
                if writer is not None:
                    _commit(writer, summary)
                shard = queue.pop(0)
                writer = AtomicParquet(out / f"{shard.name}.parquet", _schema(desc, str(shard)))
            writer.write(_columns(shard_name, ids, recs))
            summary.invalid += sum(r.get("status") != "ok" for r in recs)
        if writer is not None:
            _commit(writer, summary)
        for shard in queue:
            _commit(AtomicParquet(out / f"{shard.name}.parquet", _schema(desc, str(shard))), summary)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    summary.seconds = time.perf_counter() - t0
    return summary


def _commit(writer: AtomicParquet, summary: ScoreSummary) -> None:
    writer.commit()
    summary.rows += writer.rows
    summary.shards_scored += 1


class _RationaleActor:
    def __init__(self, cfg: Any):
        self.pipe = _pipeline(cfg)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        from .ray_engine import _Box

        ids, rows, errs = row["batch"].value
        return {"shard": row["shard"], "start": row["start"],
                "result": _Box((ids, rationale_batch(self.pipe, rows, errs)))}


def _ray_results(cfg, ds, todo, cols, batch_size, address, concurrency, num_gpus):
    from .ray_engine import _Box, run_on_ray

    def read(item: dict[str, Any]):
        shard = ds.shards[item["index"]]
        for start, ids, rows, errs in pair_rows(ds, shard, cols, batch_size):
            yield {"shard": shard.name, "path": str(shard), "start": start, "batch": _Box((ids, rows, errs))}

    for res in run_on_ray(todo, read, _RationaleActor, {"cfg": cfg}, address=address, concurrency=concurrency,
                          num_gpus=num_gpus):
        ids, recs = res["result"].value
        yield str(res["shard"]), int(res["start"]), ids, recs
