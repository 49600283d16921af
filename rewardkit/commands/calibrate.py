"""``rewardkit calibrate``: record what a preference model's raw scores look like on a calibration set.

    rewardkit calibrate --model runs/arena/model --data calib.jsonl [--limit 2000]

Scores every image of the data (both candidates of each pair for preference data with image_a / image_b;
or the ``image`` column of a scoring file with prompt / image / optional sources), then writes
``calibration.json`` (n, mean, std, min, max, quantiles) into the model directory. ``load_reward("preference",
model=..., normalize="calibration")`` then returns z-scores, ``normalize="quantile"`` positions in [0, 1].
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="save raw-score statistics (mean/std/quantiles) with a preference model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", "-m", required=True, type=Path, help="local preference model directory")
    p.add_argument("--data", "-d", required=True,
                   help="pairs (hub id, .parquet/.jsonl/.json/.csv, folder, synthetic:brightness) or a file with "
                        "prompt/image[/sources] columns")
    p.add_argument("--split", default="train", help="dataset split for hub data (default train)")
    p.add_argument("--limit", type=int, default=None, help="use at most this many rows")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", help="torch device (default: cuda if available)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from ..models.preference import CONFIG_NAME, PreferenceModel, calibration_stats
    from ..train.data import _to_image

    if not (args.model / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{args.model} is not a local preference model directory (no {CONFIG_NAME})")
    model = PreferenceModel.from_pretrained(str(args.model), device=args.device, dtype=args.dtype)
    ds, base = _load_any(args.data, args.split, args.limit)
    cols = set(ds.column_names)
    rows = []  # (image, prompt, sources)
    for r in ds:
        srcs = r.get("sources") or []
        for col in (("image_a", "image_b") if "image_a" in cols else ("image",)):
            rows.append((r[col], str(r["prompt"]), srcs))
    scores = []
    bs = max(args.batch_size, 1)
    for s in tqdm(range(0, len(rows), bs), desc="calibrate", unit="batch", disable=args.no_progress):
        chunk = rows[s:s + bs]
        imgs = [_to_image(x, base) for x, _, _ in chunk]
        srcs = [[_to_image(y, base) for y in ss] for _, _, ss in chunk]
        r, _ = model.score(imgs, [p for _, p, _ in chunk], srcs if any(srcs) else None, batch_size=bs)
        scores.append(r)
    stats = calibration_stats(torch.cat(scores) if scores else torch.zeros(0))
    stats["data"] = str(args.data)
    stats["template"] = model.template.version
    model.save_calibration(args.model, stats)
    print(json.dumps(stats, indent=1))
    return 0


def _load_any(source: str, split: str, limit: int | None):
    """Pairs through :func:`load_pairs`; a plain prompt/image scoring file through ``datasets`` directly."""
    from .._imports import require
    from ..train.data import _FILE_BUILDERS, load_pairs

    p = Path(source)
    if p.is_file() and p.suffix.lower() in _FILE_BUILDERS:
        datasets = require("datasets", "bench")
        ds = datasets.load_dataset(_FILE_BUILDERS[p.suffix.lower()], data_files=str(p), split="train")
        if "image" in ds.column_names and "prompt" in ds.column_names:
            return (ds.select(range(min(limit, len(ds)))) if limit else ds), p.parent
    return load_pairs(source, split=split, max_samples=limit, synthetic_size=limit or 512)
