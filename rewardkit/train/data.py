"""Preference-pair data through Hugging Face ``datasets``.

Schema (one row per comparison)::

    prompt    str                        the prompt / edit instruction
    image_a   image                      candidate A  (a PIL image, a path, bytes, or {"bytes", "path"})
    image_b   image                      candidate B
    label     str                        "A", "B" or "tie"  (also accepted: a/b, model_a/model_b,
                                         leftvote/rightvote/tievote/bothbad_vote, left/right, 0/1 meaning A/B)
    sources   list[image], optional      source image(s) of an edit, shown before the candidate
    margin    float, optional            required reward gap for the winner (Bradley–Terry margin)
    weight    float, optional            per-pair loss weight

Relative image paths are resolved against the data file's folder. Sources of data:

- a hub dataset id (``load_dataset(id, split=...)``);
- a local ``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv`` file;
- a local folder with ``metadata.jsonl`` / ``metadata.parquet`` (or ``*.parquet`` / ``*.jsonl`` files) beside
  the images it names (an "image folder" of pairs);
- ``synthetic:brightness`` - a learnable toy task (the brighter of two same-texture images wins), for smoke
  tests and CI.

Common public layouts are converted on load (``layout="auto"``): ``chosen`` / ``rejected`` (TRL / RLHF style,
chosen -> A) and Pick-a-Pic (``jpg_0``, ``jpg_1``, ``label_0``, ``caption``).
"""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from .._imports import require
from .losses import LABEL_A, LABEL_B, LABEL_TIE

__all__ = ["normalize_label", "load_pairs", "convert_chosen_rejected", "convert_pickapic",
           "synthetic_brightness_pairs", "PairCollator", "LAYOUTS", "preflight_pairs", "BadRow", "DataRowError"]

_LABELS = {
    "a": LABEL_A, "model_a": LABEL_A, "leftvote": LABEL_A, "left": LABEL_A, "0": LABEL_A, "image_a": LABEL_A,
    "b": LABEL_B, "model_b": LABEL_B, "rightvote": LABEL_B, "right": LABEL_B, "1": LABEL_B, "image_b": LABEL_B,
    "tie": LABEL_TIE, "tievote": LABEL_TIE, "bothbad_vote": LABEL_TIE, "tie (bothbad)": LABEL_TIE, "draw": LABEL_TIE,
}
LAYOUTS = ("auto", "ab", "chosen_rejected", "pickapic")
_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def normalize_label(x: Any) -> int:
    """``"A"`` / ``"B"`` / ``"tie"`` (and the aliases in the module docstring) -> LABEL_A / LABEL_B / LABEL_TIE."""
    if isinstance(x, bool) or x is None:
        raise ValueError(f"bad preference label {x!r}; use 'A', 'B' or 'tie'")
    key = str(x).strip().lower()
    if key not in _LABELS:
        raise ValueError(f"bad preference label {x!r}; use 'A', 'B' or 'tie'")
    return _LABELS[key]


def convert_chosen_rejected(ds: Any, prompt_column: str | None = None) -> Any:
    """``{prompt|caption, chosen, rejected}`` -> the rewardkit schema with ``image_a = chosen``, label ``"A"``.

    The two candidates are scored independently, so always putting the winner in slot A adds no bias.
    """
    pc = prompt_column or ("prompt" if "prompt" in ds.column_names else "caption")
    ds = ds.rename_columns({"chosen": "image_a", "rejected": "image_b", **({pc: "prompt"} if pc != "prompt" else {})})
    return ds.add_column("label", ["A"] * len(ds))


def convert_pickapic(ds: Any) -> Any:
    """Pick-a-Pic v2 (``caption``, ``jpg_0``, ``jpg_1``, ``label_0`` in {1, 0.5, 0}) -> rewardkit schema."""
    def lab(v: float) -> str:
        return "A" if v == 1 else "B" if v == 0 else "tie"

    labels = [lab(float(v)) for v in ds["label_0"]]
    ds = ds.rename_columns({"caption": "prompt", "jpg_0": "image_a", "jpg_1": "image_b"})
    keep = {"prompt", "image_a", "image_b"}
    ds = ds.remove_columns([c for c in ds.column_names if c not in keep])
    return ds.add_column("label", labels)


def _apply_layout(ds: Any, layout: str) -> Any:
    cols = set(ds.column_names)
    if layout == "auto":
        if {"image_a", "image_b"} <= cols:
            layout = "ab"
        elif {"chosen", "rejected"} <= cols:
            layout = "chosen_rejected"
        elif {"jpg_0", "jpg_1", "label_0"} <= cols:
            layout = "pickapic"
        else:
            raise ValueError(f"cannot tell the data layout from columns {sorted(cols)}; expected image_a/image_b/"
                             "label, chosen/rejected or jpg_0/jpg_1/label_0")
    if layout == "chosen_rejected":
        ds = convert_chosen_rejected(ds)
    elif layout == "pickapic":
        ds = convert_pickapic(ds)
    elif layout != "ab":
        raise ValueError(f"unknown layout {layout!r}; choose from {LAYOUTS}")
    missing = {"prompt", "image_a", "image_b", "label"} - set(ds.column_names)
    if missing:
        raise ValueError(f"preference data lacks column(s) {sorted(missing)}")
    return ds


def synthetic_brightness_pairs(n: int, *, seed: int = 0, size: int = 32, tie_fraction: float = 0.0) -> Any:
    """``n`` pairs of one random texture at two brightness levels; the brighter image wins.

    A learnable preference for tests and smoke runs. ``tie_fraction`` of the pairs are exact copies
    labelled "tie". Images are stored as PNG bytes (the ``datasets`` Image feature).
    """
    datasets = require("datasets", "bench")
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    prompts = ["a photo of a cat", "a red car", "two birds on a branch", "a bowl of fruit", "a city at night"]
    rows: dict[str, list[Any]] = {"prompt": [], "image_a": [], "image_b": [], "label": []}

    def png(arr: "np.ndarray") -> dict[str, Any]:
        buf = io.BytesIO()
        Image.fromarray(arr, "RGB").save(buf, format="PNG")
        return {"bytes": buf.getvalue(), "path": None}

    for _ in range(n):
        tex = rng.uniform(0.3, 1.0, (size, size, 3))
        lo, hi = sorted(rng.uniform(0.15, 1.0, 2))
        if hi - lo < 0.15:  # keep the task learnable: a visible brightness gap
            lo = max(hi - 0.15, 0.0)
        tie = rng.uniform() < tie_fraction
        bright, dark = (tex * hi * 255).astype(np.uint8), (tex * lo * 255).astype(np.uint8)
        if tie:
            a, b, lab = bright, bright.copy(), "tie"
        elif rng.uniform() < 0.5:
            a, b, lab = bright, dark, "A"
        else:
            a, b, lab = dark, bright, "B"
        rows["prompt"].append(str(rng.choice(prompts)))
        rows["image_a"].append(png(a))
        rows["image_b"].append(png(b))
        rows["label"].append(lab)
    features = datasets.Features({"prompt": datasets.Value("string"), "image_a": datasets.Image(),
                                  "image_b": datasets.Image(), "label": datasets.Value("string")})
    return datasets.Dataset.from_dict(rows, features=features)


def _pair_files(source: str) -> list[Path] | None:
    """The local files :func:`load_pairs` reads the rows of ``source`` from, in order: the file itself, or a
    folder's ``metadata.parquet`` / ``metadata.jsonl`` (the first found), else its ``*.parquet``, else its
    ``*.jsonl``, sorted. None for what is not a local path (``synthetic:...``, a hub id). Raises for a local
    path it cannot read (an unsupported file, a folder without row files, a path that does not exist)."""
    if source.startswith("synthetic:"):
        return None
    p = Path(source).expanduser()
    if p.is_file():
        if p.suffix.lower() not in _FILE_BUILDERS:
            raise ValueError(f"unsupported data file {p} (use .parquet, .jsonl, .json or .csv)")
        return [p]
    if p.is_dir():
        files = [f for name in ("metadata.parquet", "metadata.jsonl") if (f := p / name).is_file()]
        files = files[:1] or sorted(p.glob("*.parquet")) or sorted(p.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"{p}: no metadata.jsonl / metadata.parquet / *.parquet / *.jsonl inside")
        return files
    if source.startswith((".", "/", "~")):
        raise FileNotFoundError(f"data not found: {source}")
    return None


def load_pairs(source: str, *, split: str = "train", layout: str = "auto", max_samples: int | None = None,
               synthetic_size: int = 512, seed: int = 0, revision: str | None = None,
               check_labels: bool = True) -> tuple[Any, Path | None]:
    """Load preference pairs; returns ``(dataset, base_dir)`` where ``base_dir`` resolves relative paths.

    The dataset has the schema of the module docstring (after layout conversion). Labels are validated
    (``ValueError`` naming the first bad rows) unless ``check_labels=False``: a caller that checks every row
    itself (the trainer's preflight, which lists every bad row and, with ``skip_bad_rows``, drops it like any
    other row error) loads the data as it is.
    """
    datasets = require("datasets", "bench")
    base_dir: Path | None = None
    if source.startswith("synthetic:"):
        kind, _, arg = source.partition(":")[2].partition("?")
        if kind != "brightness":
            raise ValueError(f"unknown synthetic data {source!r}; use synthetic:brightness")
        ds = synthetic_brightness_pairs(synthetic_size, seed=seed + (0 if split == "train" else 10_000))
    elif (files := _pair_files(source)) is not None:
        builder = _FILE_BUILDERS[files[0].suffix.lower()]
        ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
        p = Path(source).expanduser()
        base_dir = p if p.is_dir() else p.parent
    else:
        ds = datasets.load_dataset(source, split=split, revision=revision)
    ds = _apply_layout(ds, layout)
    bad = []
    for i, lab in enumerate(ds["label"] if check_labels else ()):
        try:
            normalize_label(lab)
        except ValueError as exc:
            bad.append(f"row {i}: {exc}")
            if len(bad) >= 5:
                break
    if bad:
        raise ValueError("bad labels in preference data: " + "; ".join(bad))
    if max_samples is not None and len(ds) > max_samples:
        ds = ds.select(range(max_samples))
    return ds, base_dir


class DataRowError(ValueError):
    """A preference-data row cannot be used; the message names the row index and the file."""


@dataclass
class BadRow:
    """One unusable row found by :func:`preflight_pairs` (or at collation): ``index`` in the loaded dataset,
    ``column`` (``image_a`` / ``image_b`` / ``sources[j]`` / ``prompt`` / ``label``), ``where`` (the file path, or
    ``<bytes>`` for embedded images) and the ``reason``."""

    index: int
    column: str
    where: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.index}: {self.column} ({self.where}): {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "column": self.column, "where": self.where, "reason": self.reason}


def _resolve(x: Any, base_dir: Path | None) -> tuple[Any, str]:
    """An image entry -> (what media reads, a description of where it is: the path or ``<bytes>``)."""
    if isinstance(x, dict):  # datasets Image feature with decode=False, or a raw {"bytes", "path"}
        if x.get("bytes") is not None:
            return x["bytes"], str(x.get("path") or "<bytes>")
        if x.get("path"):
            x = x["path"]
        else:
            raise ValueError("image entry has neither bytes nor path")
    if isinstance(x, str):
        if base_dir is not None and not Path(x).is_absolute():
            x = str(base_dir / x)
        return x, x
    if isinstance(x, (bytes, bytearray)):
        return x, "<bytes>"
    return x, f"<{type(x).__name__}>"


def _to_image(x: Any, base_dir: Path | None):
    from .. import media

    x, _ = _resolve(x, base_dir)
    return media.to_pil(x)


def _row_entries(row: dict[str, Any]) -> list[tuple[str, Any]]:
    out = [("image_a", row.get("image_a")), ("image_b", row.get("image_b"))]
    out += [(f"sources[{j}]", s) for j, s in enumerate(row.get("sources") or [])]
    return out


def _check_row_header(index: int, row: dict[str, Any], base_dir: Path | None) -> list[BadRow]:
    """Everything about one row that can be checked without decoding pixels (image headers, prompt, label)."""
    from .. import media

    bad = []
    p = row.get("prompt")
    if not isinstance(p, str) or not p.strip():
        bad.append(BadRow(index, "prompt", "-", f"prompt must be a non-empty string, got {p!r:.60}"))
    try:
        normalize_label(row.get("label"))
    except ValueError as exc:
        bad.append(BadRow(index, "label", "-", str(exc)))
    for col, entry in _row_entries(row):
        where = "-"
        try:
            x, where = _resolve(entry, base_dir)
            w, h = media._probe(x)
            media._check_size(w, h)
        except media._Bad as exc:
            bad.append(BadRow(index, col, where, str(exc)))
        except Exception as exc:  # noqa: BLE001 -- whatever is in a row is that row's problem
            bad.append(BadRow(index, col, where, f"{type(exc).__name__}: {exc}"))
    return bad


def _without_decoding(ds: Any) -> Any:
    """The same dataset with every ``datasets.Image`` feature (also inside lists) set to ``decode=False``, so
    reading a row yields ``{"bytes", "path"}`` instead of a decoded PIL image."""
    datasets = require("datasets", "bench")

    def nd(f: Any) -> Any:
        if isinstance(f, datasets.Image):
            return datasets.Image(decode=False)
        if isinstance(f, list) and f:
            return [nd(f[0])]
        if hasattr(f, "feature") and not isinstance(f, datasets.Value):
            g = copy.copy(f)
            g.feature = nd(f.feature)
            return g
        return f

    feats = getattr(ds, "features", None)
    if not feats:
        return ds
    for k, v in feats.items():
        f = nd(v)
        if f != v:  # cast_column only relabels the feature (same Arrow storage); cast() would rewrite the data
            ds = ds.cast_column(k, f)
    return ds


def preflight_pairs(ds: Any, base_dir: Path | None = None, *, workers: int = 8, batch: int = 256,
                    progress: bool = False) -> list[BadRow]:
    """Check every row before training: image files / bytes exist and have a readable header within the size
    and aspect limits, prompts are non-empty strings, labels are valid. Headers only (no pixel is decoded),
    ``workers`` threads. Returns every bad row (empty when all are fine), in row order."""
    from concurrent.futures import ThreadPoolExecutor

    plain = _without_decoding(ds)
    n = len(plain)
    bad: list[BadRow] = []
    bar = None
    if progress and n > batch:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc="check data", unit="row", delay=1.0)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="rk-preflight") as pool:
        for s in range(0, n, batch):
            rows = plain[s:s + batch]  # column dict
            cols = list(rows)
            m = len(rows[cols[0]]) if cols else 0
            items = [{c: rows[c][j] for c in cols} for j in range(m)]
            for found in pool.map(lambda jr: _check_row_header(s + jr[0], jr[1], base_dir), enumerate(items)):
                bad.extend(found)
            if bar is not None:
                bar.update(m)
    if bar is not None:
        bar.close()
    return bad


@dataclass
class PairCollator:
    """Rows -> one model batch holding both candidates: ``[a_1..a_B, b_1..b_B]`` in a single forward pass.

    Returns ``{"inputs": processor tensors for 2B sequences, "labels": [B] long, "margin": [B] float or
    None, "weight": [B] float or None, "keep": [B] bool, "skipped": list of BadRow}``.

    A row that cannot be decoded raises :class:`DataRowError` naming the row and the file, unless
    ``skip_bad`` (what the trainer uses once a run has started): the row is then replaced by a copy of a good
    row of the same batch (or ``fallback``, a known-good row) with weight 0 and ``keep`` False, so shapes,
    collectives and the loss of the other rows are unchanged, and it is reported in ``skipped``.
    """

    model: Any  # anything with encode(images, prompts, sources): a PreferenceModel or an InputEncoder
    base_dir: Path | None = None
    skip_bad: bool = False
    fallback: dict[str, Any] | None = None

    def _decode_row(self, index: int, r: dict[str, Any]):
        p = r.get("prompt")
        if not isinstance(p, str) or not p.strip():
            raise DataRowError(str(BadRow(index, "prompt", "-", f"prompt must be a non-empty string, got {p!r:.60}")))
        try:
            label = normalize_label(r.get("label"))
        except ValueError as exc:
            raise DataRowError(str(BadRow(index, "label", "-", str(exc)))) from None
        imgs = {}
        for col, entry in _row_entries(r):
            where = "-"
            try:
                x, where = _resolve(entry, self.base_dir)
                from .. import media

                imgs[col] = media._to_pil(x)
            except Exception as exc:  # noqa: BLE001 -- media._Bad or anything else: this row's error
                raise DataRowError(str(BadRow(index, col, where, str(exc)))) from None
        srcs = [imgs[c] for c, _ in _row_entries(r) if c.startswith("sources")]
        margin = r.get("margin")
        weight = r.get("weight")
        return imgs["image_a"], imgs["image_b"], srcs, p, label, margin, weight

    def __call__(self, rows: Sequence[dict[str, Any]], indices: Sequence[int] | None = None) -> dict[str, Any]:
        idx = list(indices) if indices is not None else list(range(len(rows)))
        out: list[Any] = []
        skipped: list[BadRow] = []
        for j, r in enumerate(rows):
            if "_rk_row" in r:  # the trainer's record of the row's index in the loaded data
                idx[j] = int(r["_rk_row"])
            try:
                out.append(self._decode_row(idx[j], r))
            except DataRowError as exc:
                if not self.skip_bad:
                    raise
                skipped.append(BadRow(idx[j], "row", "-", str(exc)))
                out.append(None)
        keep = [o is not None for o in out]
        if not all(keep):
            good = next((o for o in out if o is not None), None)
            if good is None:
                if self.fallback is None:
                    raise DataRowError("every row of a batch is unusable and no fallback row is set: "
                                       + "; ".join(str(b) for b in skipped))
                good = self._decode_row(-1, self.fallback)
            out = [o if o is not None else good for o in out]
        a = [o[0] for o in out]
        b = [o[1] for o in out]
        prompts = [o[3] for o in out]
        has_src = any(o[2] for o in out)
        srcs = [o[2] for o in out] if has_src else None
        inputs = self.model.encode(a + b, prompts + prompts, None if srcs is None else srcs + srcs)
        labels = torch.tensor([o[4] for o in out], dtype=torch.long)
        margin = torch.tensor([float(o[5] or 0.0) for o in out]) if any("margin" in r for r in rows) else None
        weight = None
        if any("weight" in r for r in rows) or not all(keep):
            weight = torch.tensor([float(1.0 if o[6] is None else o[6]) if k else 0.0 for o, k in zip(out, keep)])
        return {"inputs": inputs, "labels": labels, "margin": margin, "weight": weight,
                "keep": torch.tensor(keep, dtype=torch.bool), "skipped": skipped}
