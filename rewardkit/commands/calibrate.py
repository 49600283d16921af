"""``rewardkit calibrate``: record what a reward's raw scores look like on a calibration set."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import EXIT_CODES_HELP, EXIT_INVALID, UsageError, invalid_summary
from ._common import check_device, load_reward_cli

DESCRIPTION = """Record what a reward's raw scores look like on a calibration set: n, mean, std, min, max and
quantiles, so a raw score can be read as "how good compared with typical images".

  rewardkit calibrate --reward pickscore --data calib.jsonl -o pickscore-calib.json    # any reward
  rewardkit calibrate --model runs/arena_tiny/model --data calib.jsonl --limit 2000    # a preference model

The input: a JSONL (or .json / .csv / .parquet) file with one row per image, columns prompt and image
(a path relative to the file, or bytes) and optional sources (a list of paths, for editing rewards), e.g.
  {"prompt": "a red apple on a wooden table", "image": "imgs/apple.png"}
written by hand or from your generator's outputs (examples/images/t2i.jsonl is one). Preference-pair
data works too: a hub dataset id, a pair file with image_a / image_b columns, or synthetic:brightness
(both images of every pair are scored).

With --reward the statistics go to --output; a composite axis reads that file (normalize: fixed,
calibration: FILE). With --model alone they are stored as calibration.json in the preference model's
directory; load it with --reward preference --set normalize=calibration (z-scores) or
normalize=quantile (positions in [0, 1])."""


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="raw-score statistics (mean/std/quantiles) of a reward on a calibration set",
                       description=DESCRIPTION, epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    if args.reward is not None:
        return _run_any_reward(args)
    if args.model is None:
        raise UsageError("give --model (a preference model directory) or --reward NAME")
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
    from ..reward import config_dict

    if args.output is None:
        raise UsageError("--reward needs --output FILE.json")
    kwargs = parse_overrides(args.overrides)
    for key in ("model", "device"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    if args.dtype != "float32":
        kwargs["dtype"] = args.dtype
    rows, base = _rows(args)
    if not rows:
        raise UsageError(f"--data {args.data}: no rows to score")
    reward = load_reward_cli(args.reward, None, kwargs)
    print(f"calibrating {args.reward} on {len(rows)} image(s) from {args.data}", file=sys.stderr)
    scores, invalid = [], 0
    bs = max(args.batch_size, 1)
    for s in tqdm(range(0, len(rows), bs), desc=f"calibrate {args.reward}", unit="batch", disable=args.no_progress,
                  file=sys.stderr):
        chunk = rows[s:s + bs]
        srcs = [[_raw_image(y, base) for y in ss] for _, _, ss in chunk]
        # undecoded: the reward decodes, and a bad file becomes one invalid sample, not a failed run
        out = reward([_raw_image(x, base) for x, _, _ in chunk], [p for _, p, _ in chunk],
                     sources=srcs if reward.accepts_sources and any(srcs) else None, on_error="nan")
        scores.append(out.scores[out.valid])
        invalid += int((~out.valid).sum())
    valid = torch.cat(scores) if scores else torch.zeros(0)
    if valid.numel() < 2:  # never store statistics of (almost) nothing
        print(f"error: {valid.numel()} image(s) scored; calibration needs at least 2: nothing written",
              file=sys.stderr)
        return max(invalid_summary(invalid, len(rows), "images"), EXIT_INVALID)
    stats = calibration_stats(valid)
    stats.update({"reward": reward.name, "config": config_dict(reward), "data": str(args.data),
                  "n_invalid": invalid})
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(args.output.suffix + ".tmp")
    tmp.write_text(json.dumps(stats, indent=1, default=str), encoding="utf-8")
    tmp.replace(args.output)
    print(json.dumps({k: v for k, v in stats.items() if k != "config"}, indent=1))
    print(f"wrote {args.output}", file=sys.stderr)
    return invalid_summary(invalid, len(rows), "images")


def _run_preference(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from ..models.preference import CONFIG_NAME, PreferenceModel, calibration_stats
    from ..train.data import _to_image

    args.model = Path(args.model)
    if not (args.model / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{args.model} is not a local preference model directory (no {CONFIG_NAME})")
    check_device(args.device)
    rows, base = _rows(args)
    if not rows:
        raise UsageError(f"--data {args.data}: no rows to score")
    print(f"loading preference model {args.model} ...", file=sys.stderr, flush=True)
    model = PreferenceModel.from_pretrained(str(args.model), device=args.device, dtype=args.dtype)
    print(f"calibrating on {len(rows)} image(s) from {args.data}", file=sys.stderr)
    scores = []
    bs = max(args.batch_size, 1)
    for s in tqdm(range(0, len(rows), bs), desc="calibrate", unit="batch", disable=args.no_progress,
                  file=sys.stderr):
        chunk = rows[s:s + bs]
        imgs = [_to_image(x, base) for x, _, _ in chunk]
        srcs = [[_to_image(y, base) for y in ss] for _, _, ss in chunk]
        r, _ = model.score(imgs, [p for _, p, _ in chunk], srcs if any(srcs) else None, batch_size=bs)
        scores.append(r)
    allscores = torch.cat(scores) if scores else torch.zeros(0)
    finite = torch.isfinite(allscores)
    n_bad = int((~finite).sum())
    if int(finite.sum()) < 2:  # never store statistics of (almost) nothing
        print(f"error: {int(finite.sum())} finite score(s); calibration needs at least 2: nothing written",
              file=sys.stderr)
        return max(invalid_summary(n_bad, len(rows), "images"), EXIT_INVALID)
    stats = calibration_stats(allscores[finite])
    stats["data"] = str(args.data)
    stats["template"] = model.template.version
    stats["n_invalid"] = n_bad
    model.save_calibration(args.model, stats)
    print(json.dumps(stats, indent=1))
    print(f"wrote {args.model / 'calibration.json'}", file=sys.stderr)
    return invalid_summary(n_bad, len(rows), "images")


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
