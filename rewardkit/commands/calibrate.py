"""``rewardkit calibrate``: record what a reward's raw scores look like on a calibration set.

    rewardkit calibrate --model runs/arena/model --data calib.jsonl [--limit 2000]        # a preference model
    rewardkit calibrate --reward pickscore --data calib.jsonl -o pickscore-calib.json      # any reward

With ``--reward NAME`` any registered reward scores the set and the statistics go to ``--output`` (a
composite axis reads them with ``normalize: fixed`` and ``calibration: FILE``). Without it:

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
    p = sub.add_parser("calibrate", help="raw-score statistics (mean/std/quantiles) of a reward on a calibration set",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reward", "-r", help="any registered reward (default: a preference model given by --model)")
    p.add_argument("--model", "-m", help="local preference model directory; with --reward, its model option")
    p.add_argument("--output", "-o", type=Path, help="statistics JSON to write (required with --reward)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="reward options with --reward")
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
    if args.reward is not None:
        return _run_any_reward(args)
    if args.model is None:
        raise SystemExit("rewardkit calibrate: give --model (a preference model directory) or --reward NAME")
    return _run_preference(args)


def _rows(args: argparse.Namespace):
    ds, base = _load_any(args.data, args.split, args.limit)
    cols = set(ds.column_names)
    rows = []  # (image, prompt, sources)
    for r in ds:
        srcs = r.get("sources") or []
        for col in (("image_a", "image_b") if "image_a" in cols else ("image",)):
            rows.append((r[col], str(r["prompt"]), srcs))
    return rows, base


def _run_any_reward(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from ..calibration import calibration_stats
    from ..config import parse_overrides
    from ..registry import load_reward
    from ..reward import config_dict

    if args.output is None:
        raise SystemExit("rewardkit calibrate: --reward needs --output FILE.json")
    kwargs = parse_overrides(args.overrides)
    for key in ("model", "device"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    if args.dtype != "float32":
        kwargs["dtype"] = args.dtype
    reward = load_reward(args.reward, **kwargs)
    rows, base = _rows(args)
    scores, invalid = [], 0
    bs = max(args.batch_size, 1)
    for s in tqdm(range(0, len(rows), bs), desc=f"calibrate {args.reward}", unit="batch", disable=args.no_progress):
        chunk = rows[s:s + bs]
        srcs = [[_raw_image(y, base) for y in ss] for _, _, ss in chunk]
        # undecoded: the reward decodes, and a bad file becomes one invalid sample, not a failed run
        out = reward([_raw_image(x, base) for x, _, _ in chunk], [p for _, p, _ in chunk],
                     sources=srcs if reward.accepts_sources and any(srcs) else None, on_error="nan")
        scores.append(out.scores[out.valid])
        invalid += int((~out.valid).sum())
    stats = calibration_stats(torch.cat(scores) if scores else torch.zeros(0))
    stats.update({"reward": reward.name, "config": config_dict(reward), "data": str(args.data),
                  "n_invalid": invalid})
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(args.output.suffix + ".tmp")
    tmp.write_text(json.dumps(stats, indent=1, default=str), encoding="utf-8")
    tmp.replace(args.output)
    print(json.dumps({k: v for k, v in stats.items() if k != "config"}, indent=1))
    return 0


def _run_preference(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from ..models.preference import CONFIG_NAME, PreferenceModel, calibration_stats
    from ..train.data import _to_image

    args.model = Path(args.model)
    if not (args.model / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{args.model} is not a local preference model directory (no {CONFIG_NAME})")
    model = PreferenceModel.from_pretrained(str(args.model), device=args.device, dtype=args.dtype)
    rows, base = _rows(args)
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


def _raw_image(x, base: Path | None):
    """A dataset image entry as something the reward decodes itself: bytes, a path, or the object as is."""
    if isinstance(x, dict):  # datasets Image feature with decode=False, or {"bytes", "path"}
        x = x.get("bytes") if x.get("bytes") is not None else x.get("path")
    if isinstance(x, str) and base is not None and not Path(x).is_absolute():
        return str(base / x)
    return x


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
