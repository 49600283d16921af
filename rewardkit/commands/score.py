"""``rewardkit score``: score image files with any reward, printing scores and writing JSONL.

Inputs either as paths on the command line with one ``--prompt``, or ``--jsonl FILE`` with one object per
line: ``{"prompt": "...", "image": "a.png"}`` (or ``"images": [...]`` to score several images against one
prompt) and optional ``"sources": ["src.png", ...]`` for editing rewards. Relative paths in a JSONL file are
resolved against the file's folder. Results are written as they are computed, so an interrupted run keeps
what it scored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub) -> None:
    p = sub.add_parser(
        "score", help="score images with a reward",
        description="Score images with a reward. Examples:\n"
                    "  rewardkit score --reward pickscore a.png b.png --prompt 'a cat'\n"
                    "  rewardkit score --reward clipscore --model ./my-clip --jsonl items.jsonl --output scores.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", nargs="*", help="image files to score (with --prompt)")
    p.add_argument("--reward", "-r", required=True, help="registry name (see `rewardkit ls`)")
    p.add_argument("--model", "-m", help="hub id or local checkpoint directory for model-backed rewards")
    p.add_argument("--prompt", "-p", help="prompt / instruction for the images given on the command line")
    p.add_argument("--sources", nargs="+", metavar="IMAGE",
                   help="source / reference image(s) shared by every command-line image (editing rewards)")
    p.add_argument("--jsonl", type=Path, help="JSONL file of {prompt, image|images, sources?} objects")
    p.add_argument("--output", "-o", type=Path, help="write one JSON result per image to this JSONL file")
    p.add_argument("--device", help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--dtype", help="float32, float16 or bfloat16")
    p.add_argument("--batch-size", type=int, default=16, help="images per model call (default 16)")
    p.add_argument("--config", type=Path, help="YAML file with the reward's options")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override reward options, e.g. --set normalize=calibration")
    p.add_argument("--on-error", choices=("nan", "raise"), default="nan",
                   help="bad images: 'nan' scores the rest and reports them (default), 'raise' stops")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _items(args: argparse.Namespace) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if args.jsonl is not None:
        if args.images:
            raise SystemExit("rewardkit score: give image paths or --jsonl, not both")
        base = args.jsonl.parent
        if not args.jsonl.is_file():
            raise FileNotFoundError(f"JSONL file not found: {args.jsonl}")
        with args.jsonl.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SystemExit(f"rewardkit score: {args.jsonl}:{lineno}: not JSON ({exc})") from None
                if not isinstance(rec, dict) or "prompt" not in rec or not ({"image", "images"} & set(rec)):
                    raise SystemExit(f"rewardkit score: {args.jsonl}:{lineno}: needs 'prompt' and 'image' or 'images'")
                paths = rec.get("images") or [rec["image"]]
                srcs = rec.get("sources")
                srcs = [srcs] if isinstance(srcs, str) else srcs
                for path in paths:
                    items.append({"image": str(base / path), "prompt": rec["prompt"],
                                  "sources": None if srcs is None else [str(base / s) for s in srcs],
                                  "metadata": rec.get("metadata"), "line": lineno})
        return items
    if not args.images:
        raise SystemExit("rewardkit score: give image paths (with --prompt) or --jsonl FILE")
    if args.prompt is None:
        raise SystemExit("rewardkit score: --prompt is required with image paths")
    return [{"image": p, "prompt": args.prompt, "sources": args.sources, "metadata": None} for p in args.images]


def _reward_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from ..config import parse_overrides

    kwargs: dict[str, Any] = parse_overrides(args.overrides)
    for key in ("model", "device", "dtype"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    return kwargs


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from ..registry import load_reward

    if args.batch_size < 1:
        raise SystemExit("rewardkit score: --batch-size must be >= 1")
    kwargs = _reward_kwargs(args)  # first: a file name swallowed by --set gets its hint before anything else
    items = _items(args)
    has_sources = any(it["sources"] for it in items)
    from ..distributed import ScoreShards, local_device

    shards = ScoreShards.from_env(len(items), args.batch_size)  # torchrun / accelerate launch: this rank's part
    if shards is not None:
        items, device = shards.select(items), local_device(kwargs.get("device"))
        if device is not None:
            kwargs["device"] = device
        args.no_progress = args.no_progress or not shards.is_main
    reward = load_reward(args.reward, str(args.config) if args.config else None, **kwargs)
    out_path = shards.part_path(args.output) if shards is not None else args.output
    out_fh = out_path.open("w", encoding="utf-8") if out_path else None
    n_bad = 0
    results = []
    try:
        bar = tqdm(total=len(items), desc=f"scoring with {args.reward}", unit="img", delay=1.0,
                   disable=args.no_progress, file=sys.stderr)
        for s in range(0, len(items), args.batch_size):
            chunk = items[s:s + args.batch_size]
            out = reward([it["image"] for it in chunk], [it["prompt"] for it in chunk],
                         sources=[it["sources"] or [] for it in chunk] if has_sources else None,
                         metadata=[it["metadata"] for it in chunk] if any(it["metadata"] for it in chunk) else None,
                         on_error=args.on_error)
            for it, rec in zip(chunk, out.records()):
                row = {"image": it["image"], "prompt": it["prompt"], **rec}
                if it["sources"]:
                    row["sources"] = it["sources"]
                n_bad += not rec["valid"]
                results.append(row)
                if out_fh:
                    out_fh.write(json.dumps(row) + "\n")
            if out_fh:
                out_fh.flush()
            bar.update(len(chunk))
        bar.close()
    finally:
        if out_fh:
            out_fh.close()
    if shards is not None:  # rows of every rank, in input order; rank 0 writes the output and prints
        results = shards.merge(results, args.output)
        if results is None:
            return 0
        n_bad = sum(not r["valid"] for r in results)
    width = max((len(r["image"]) for r in results), default=5)
    print(f"{'image'.ljust(width)}  score")
    for r in results:
        score = f"{r['score']:.6g}" if r["valid"] else f"NaN  ({r['error']})"
        print(f"{r['image'].ljust(width)}  {score}")
    if args.output:
        print(f"wrote {len(results)} results to {args.output}", file=sys.stderr)
    if n_bad:
        print(f"{n_bad} of {len(results)} images could not be scored (see errors above)", file=sys.stderr)
    return 0
