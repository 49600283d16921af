"""Rows of ``rewardkit score`` / ``rewardkit compare`` outputs (JSONL) and of Parquet files with the same
columns (``id``, ``image``, ``prompt``, ``score``, ``valid``, ``error`` and one column per dimension), as the
sections the page draws.

A score row becomes ``{"n", "img", "src", "path", "prompt", "score", "valid", "error", "dims", "info"}``:
``img`` / ``src`` are keys into the report's image table, ``dims`` maps each dimension to a number or None,
``info`` holds what explains the score (``rationale``, ``details``, ``info``, ``metadata`` and any other
field) for the page to show as text.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .images import ImageStore

__all__ = ["read_rows", "score_section", "pairs_section", "is_pairs"]

SCORE_FIELDS = ("image", "prompt", "score", "valid", "error", "dimensions", "sources", "id")
INFO_FIELDS = ("rationale", "details", "info", "metadata")


class ViewInputError(ValueError):
    """An input the report cannot read; the message names the file (and line)."""


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    from ..config import iter_jsonl

    rows = []
    for lineno, rec in iter_jsonl(path, error=ViewInputError):
        if not isinstance(rec, dict):
            raise ViewInputError(f"{path}:{lineno}: a line must be a JSON object")
        rec["_line"] = lineno
        rows.append(rec)
    if not rows:
        raise ViewInputError(f"{path}: no rows (the file is empty)")
    return rows


def read_parquet(path: Path) -> list[dict[str, Any]]:
    from .._imports import require

    pq = require("pyarrow.parquet", "bench", "reading Parquet score files")
    import pyarrow as pa

    table = pq.read_table(path)
    # numeric columns other than the fixed ones are the dimensions (as `rewardkit score`'s "dimensions")
    dims = [f.name for f in table.schema if f.name not in SCORE_FIELDS
            and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))]
    rows = table.to_pylist()
    if not rows:
        raise ViewInputError(f"{path}: no rows")
    for i, r in enumerate(rows):
        r["_line"] = i + 1
        if dims and "dimensions" not in r:
            r["dimensions"] = {d: r.pop(d) for d in dims}
    return rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet file, each with ``_line`` (1-based line / row number)."""
    return read_parquet(path) if Path(path).suffix.lower() == ".parquet" else read_jsonl(path)


def is_pairs(rows: list[dict[str, Any]]) -> bool:
    """True for ``rewardkit compare`` output (``image_a`` / ``image_b`` / ``prob_a``)."""
    return all("image_a" in r and "image_b" in r for r in rows)


def _image_key(store: ImageStore, value: Any, base: Path, name: str) -> str | None:
    """An image field (a path, encoded bytes, or a datasets-style ``{"bytes", "path"}`` dict) as a store key."""
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("bytes"):
            return store.add_bytes(value["bytes"], value.get("path") or name)
        value = value.get("path")
        if value is None:
            return None
    if isinstance(value, (bytes, bytearray)):
        return store.add_bytes(bytes(value), name)
    p = Path(str(value))
    if not p.is_absolute() and not p.exists() and (base / p).exists():
        p = base / p  # written relative to the file's folder rather than the scoring run's directory
    return store.add_path(p)


def score_section(path: Path, rows: list[dict[str, Any]], store: ImageStore, label: str) -> dict[str, Any]:
    """The ``scores`` section of one score file."""
    base = Path(path).parent
    dims: list[str] = []
    out = []
    for i, r in enumerate(rows):
        where = f"{path}:{r['_line']}"
        if "score" not in r or "valid" not in r:
            raise ViewInputError(f"{where}: a score row needs 'score' and 'valid' (rewardkit score output)")
        d = r.get("dimensions")
        if d is not None and not isinstance(d, dict):
            raise ViewInputError(f"{where}: 'dimensions' must be an object")
        row_dims = {k: _num(v) for k, v in (d or {}).items()}
        info = {k: r[k] for k in INFO_FIELDS if r.get(k) is not None}
        for k, v in r.items():
            if k in SCORE_FIELDS or k in INFO_FIELDS or k == "_line" or v is None:
                continue
            info[k] = v
        dims += [k for k in row_dims if k not in dims]
        image = r.get("image")
        name = Path(str(image)).name if isinstance(image, str) else f"row {r['_line']}"
        srcs = r.get("sources") or []
        if isinstance(srcs, str):
            srcs = [srcs]
        out.append({
            "n": i + 1, "id": None if r.get("id") is None else str(r["id"]),
            "path": image if isinstance(image, str) else (image.get("path") if isinstance(image, dict) else None),
            "img": _image_key(store, image, base, name),
            "src": [k for k in (_image_key(store, s, base, f"source {j + 1}") for j, s in enumerate(srcs)) if k],
            "prompt": "" if r.get("prompt") is None else str(r["prompt"]),
            "score": _num(r["score"]), "valid": bool(r["valid"]),
            "error": None if r.get("error") is None else str(r["error"]),
            "dims": row_dims, "info": info or None,
        })
    return {"kind": "scores", "label": label, "file": str(path), "dims": dims, "rows": out}


def pairs_section(path: Path, rows: list[dict[str, Any]], store: ImageStore, label: str) -> dict[str, Any]:
    """The ``pairs`` section of one ``rewardkit compare`` output."""
    base = Path(path).parent
    out = []
    for i, r in enumerate(rows):
        out.append({
            "n": i + 1, "prompt": "" if r.get("prompt") is None else str(r["prompt"]),
            "a": _image_key(store, r["image_a"], base, "A"), "b": _image_key(store, r["image_b"], base, "B"),
            "path_a": str(r["image_a"]), "path_b": str(r["image_b"]),
            "prob_a": _num(r.get("prob_a")), "score_a": _num(r.get("score_a")), "score_b": _num(r.get("score_b")),
            "valid": bool(r.get("valid")), "error": None if r.get("error") is None else str(r["error"]),
        })
    return {"kind": "pairs", "label": label, "file": str(path), "rows": out}
