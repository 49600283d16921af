"""``rewardkit view`` on a ``rewardkit score --dataset`` output folder: the score files joined back to the
source dataset's images and prompts.

A score folder holds one Parquet file per shard (``shard``, ``row``, ``id``, ``score``, ``valid``, ``error`` and
one column per dimension) and ``_rewardkit_scores.json``, which records the dataset it scored (``inputs``,
``format``, ``split``) and the columns it read (``columns``: image, prompt, sources, id). The viewer reads the
source shards again, row for row, and shows each score beside its image and prompt. When the source cannot be
read (moved, deleted, a hub dataset offline) the scores are still shown, with the reason in the section's note.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from .images import ImageStore
from .scores import ViewInputError, score_section

__all__ = ["MANIFEST", "is_score_folder", "dataset_section"]

MANIFEST = "_rewardkit_scores.json"
KEYS = ("shard", "row", "id", "score", "valid", "error")


def is_score_folder(path: Path) -> bool:
    """True for a folder written by ``rewardkit score --dataset`` (it holds ``_rewardkit_scores.json``)."""
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def _score_rows(folder: Path, pa: Any, pq: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted(folder.glob("*.parquet")):
        table = pq.read_table(f)
        dims = [fl.name for fl in table.schema if fl.name not in KEYS
                and (pa.types.is_integer(fl.type) or pa.types.is_floating(fl.type))]
        for r in table.to_pylist():
            r["dimensions"] = {d: r.pop(d) for d in dims}
            r["_line"] = len(rows) + 1
            rows.append(r)
    if not rows:
        raise ViewInputError(f"{folder}: no score files (*.parquet) in the folder")
    return rows


def _cell_image(v: Any) -> Any:
    """A source image as the score section reads it: bytes or a path; a PIL image or an array as PNG bytes."""
    if v is None or isinstance(v, (str, bytes, bytearray, dict)):
        return v
    from PIL import Image

    im = v if isinstance(v, Image.Image) else Image.fromarray(v)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _join_sources(man: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """Fill ``image``, ``prompt`` and ``sources`` of ``rows`` from the source dataset; the reason when not."""
    from ..datasets.readers import Columns, iter_batches
    from ..datasets.sources import open_dataset

    cols = man.get("columns") or {}
    if not cols.get("image"):
        return "the manifest names no image column"
    wanted: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        if r.get("shard") is not None and r.get("row") is not None:
            wanted.setdefault(str(r["shard"]), {})[int(r["row"])] = r
    try:
        ds = open_dataset(man["inputs"], format=man.get("format"), split=man.get("split"))
        spec = Columns(image=cols["image"], prompt=cols.get("prompt"), sources=list(cols.get("sources") or []),
                       id=None)
        joined = 0
        for shard in ds.shards:
            todo = wanted.get(shard.name)
            if not todo:
                continue
            row = 0
            for batch in iter_batches(ds, shard, spec, 256):
                for i in range(len(batch["image"])):
                    r = todo.get(row + i)
                    if r is not None:
                        r["image"] = _cell_image(batch["image"][i])
                        if batch["prompt"][i] is not None:
                            r["prompt"] = batch["prompt"][i]
                        if batch.get("sources"):
                            r["sources"] = [_cell_image(s) for s in batch["sources"][i]]
                        joined += 1
                row += len(batch["image"])
                if row > max(todo):
                    break
    except Exception as exc:  # noqa: BLE001  the scores are still worth showing: say why there are no images
        return f"the source dataset could not be read ({type(exc).__name__}: {exc})"
    missing = sum(len(v) for v in wanted.values()) - joined
    return f"{missing} score rows have no matching source row" if missing else None


def dataset_section(folder: Path, store: ImageStore, label: str) -> dict[str, Any]:
    """The ``scores`` section of a ``score --dataset`` output folder, joined to its source dataset."""
    from .._imports import require

    pq = require("pyarrow.parquet", "data", "reading dataset score files")
    import pyarrow as pa

    folder = Path(folder)
    try:
        man = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ViewInputError(f"{folder / MANIFEST}: not readable ({exc})") from None
    rows = _score_rows(folder, pa, pq)
    note = _join_sources(man, rows)
    for r in rows:
        if r.get("image") is None:
            r["image"] = None
    sec = score_section(folder / MANIFEST, rows, store, label)
    for r, out in zip(rows, sec["rows"]):  # the shard and row name the image when it is bytes in the dataset
        if out["path"] is None:
            out["path"] = f"{r.get('shard')}:{r.get('row')}"
        if out["info"]:
            out["info"].pop("shard", None)
            out["info"].pop("row", None)
            out["info"] = out["info"] or None
    sec["file"] = str(folder)
    sec["source"] = {"inputs": man.get("inputs"), "format": man.get("format"), "columns": man.get("columns"),
                     "reward": man.get("reward")}
    if note:
        sec["note"] = note
    return sec
