"""``rewardkit score``: score image files with any reward, printing scores and writing JSONL.

Inputs either as paths (files or folders) on the command line with one ``--prompt``, or ``--jsonl FILE``
with one object per line: ``{"prompt": "...", "image": "a.png"}`` (or ``"images": [...]`` to score several
images against one prompt) and optional ``"sources": ["src.png", ...]`` for editing rewards. Relative paths
in a JSONL file are resolved against the file's folder. Results are written as they are computed, so an
interrupted run keeps what it scored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import EXIT_CODES_HELP, UsageError, count, invalid_code, invalid_summary
from ._common import expand_images, load_reward_cli
from ._datasets import add_column_args, run_dataset

DESCRIPTION = """Score images with a reward. Examples:
  rewardkit score --reward pickscore a.png b.png --prompt 'a cat'
  rewardkit score --reward clipscore --model ./my-clip my_images/ --prompt 'a cat'
  rewardkit score --reward clipscore --model ./my-clip --jsonl items.jsonl --output scores.jsonl
  rewardkit score --reward preference --model ./my-rm edited.png --sources source.png --prompt 'make it red'
  rewardkit score --reward pickscore --dataset data/*.parquet --output scores/    # one scores file per shard
  rewardkit score --reward clipscore --model ./my-clip --dataset 'shards/{000..099}.tar' --prompt-column txt \
      --output scores/ --engine ray --ray-address auto --concurrency 8

JSONL lines: {"prompt": "...", "image": "a.png"} or {"prompt": "...", "images": ["a.png", "b.png"]},
optionally "sources": ["src.png"] (editing rewards) and "metadata": {...}. Relative paths in the file
resolve against the file's folder; paths on the command line against the current directory."""


def add_parser(sub) -> None:
    p = sub.add_parser("score", help="score images with a reward", description=DESCRIPTION,
                       epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", nargs="*", help="image files or folders of images to score (with --prompt)")
    p.add_argument("--reward", "-r", required=True, help="registry name (see `rewardkit ls`)")
    p.add_argument("--model", "-m", help="hub id or local checkpoint directory for model-backed rewards")
    p.add_argument("--prompt", "-p", help="prompt / instruction for the images given on the command line")
    p.add_argument("--sources", nargs="+", metavar="IMAGE",
                   help="source / reference image(s) shared by every command-line image (editing rewards)")
    p.add_argument("--jsonl", type=Path, help="JSONL file of {prompt, image|images, sources?} objects")
    p.add_argument("--output", "-o", type=Path, help="write one JSON result per image to this JSONL file "
                   "(with --dataset: the folder for the Parquet score shards)")
    p.add_argument("--device", help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--dtype", help="float32, float16 or bfloat16")
    p.add_argument("--batch-size", type=int, default=16, help="images per model call (default 16)")
    p.add_argument("--config", type=Path, help="YAML file with the reward's options")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override reward options, e.g. --set normalize=calibration")
    p.add_argument("--on-error", choices=("nan", "raise"), default="nan",
                   help="bad images: 'nan' scores the rest and reports them (default), 'raise' stops at the first")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_column_args(p)


def _path_list(value: Any, field: str, where: str) -> list[str]:
    """A JSONL path field as a list of strings; anything else is an input error naming file and line."""
    if isinstance(value, str):
        if field == "images":
            raise UsageError(f"{where}: 'images' must be a list of paths, got the string {value!r} "
                             "(use \"image\" for one path)")
        value = [value]
    if not isinstance(value, list) or not value:
        raise UsageError(f"{where}: {field!r} must be a path or a non-empty list of paths, got {value!r}")
    for v in value:
        if not isinstance(v, str) or not v.strip():
            raise UsageError(f"{where}: {field!r} holds {v!r}; every entry must be a non-empty path string")
    return value


def read_jsonl_items(path: Path) -> list[dict[str, Any]]:
    """One item per image of ``path``'s lines, paths resolved against the file's folder."""
    if not path.is_file():
        raise FileNotFoundError(f"JSONL file not found: {path}")
    base = path.parent
    items: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{where}: not JSON ({exc})") from None
            if not isinstance(rec, dict) or "prompt" not in rec or not ({"image", "images"} & set(rec)):
                raise UsageError(f"{where}: needs 'prompt' and 'image' or 'images'")
            if {"image", "images"} <= set(rec):
                raise UsageError(f"{where}: give 'image' or 'images', not both")
            if not isinstance(rec["prompt"], str):
                raise UsageError(f"{where}: 'prompt' must be a string, got {rec['prompt']!r}")
            paths = _path_list(rec["images"], "images", where) if "images" in rec else \
                _path_list(rec["image"], "image", where)
            if "image" in rec and len(paths) != 1:
                raise UsageError(f"{where}: 'image' holds {len(paths)} paths; use 'images' for several")
            srcs = rec.get("sources")
            srcs = None if srcs is None else _path_list(srcs, "sources", where)
            meta = rec.get("metadata")
            if meta is not None and not isinstance(meta, dict):
                raise UsageError(f"{where}: 'metadata' must be an object, got {meta!r}")
            for p in paths:
                items.append({"image": str(base / p), "prompt": rec["prompt"],
                              "sources": None if srcs is None else [str(base / s) for s in srcs],
                              "metadata": meta, "where": where})
    if not items:
        raise UsageError(f"{path}: no items (the file is empty)")
    return items


def _items(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.jsonl is not None:
        if args.images:
            raise UsageError("give image paths or --jsonl, not both")
        return read_jsonl_items(args.jsonl)
    if not args.images:
        raise UsageError("give image paths or folders (with --prompt) or --jsonl FILE")
    if args.prompt is None:
        raise UsageError("--prompt is required with image paths")
    return [{"image": p, "prompt": args.prompt, "sources": args.sources, "metadata": None, "where": None}
            for p in expand_images(args.images)]


def reward_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from ..config import parse_overrides

    kwargs: dict[str, Any] = parse_overrides(args.overrides)
    for key in ("model", "device", "dtype"):
        if getattr(args, key, None) is not None:
            kwargs[key] = getattr(args, key)
    return kwargs


def _describe(it: dict[str, Any], position: int) -> str:
    where = f", {it['where']}" if it.get("where") else ""
    return f"sample {position} ({it['image']}{where})"


def run(args: argparse.Namespace) -> int:
    from ..errors import RewardInputError

    if args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    kwargs = reward_kwargs(args)  # first: a file name swallowed by --set gets its hint before anything else
    if args.dataset:
        return run_dataset(args, kwargs)
    items = _items(args)
    has_sources = any(it["sources"] for it in items)
    from ..distributed import ScoreShards, local_device

    shards = ScoreShards.from_env(len(items), args.batch_size)  # torchrun / accelerate launch: this rank's part
    if shards is not None:
        items, device = shards.select(items), local_device(kwargs.get("device"))
        if device is not None:
            kwargs["device"] = device
        args.no_progress = args.no_progress or not shards.is_main
    reward = load_reward_cli(args.reward, args.config, kwargs)
    from tqdm.auto import tqdm

    print(f"scoring {len(items)} image(s) with {args.reward}" + (" (with source images)" if has_sources else ""),
          file=sys.stderr)
    n_bad = 0
    results = []
    out_path = shards.part_path(args.output) if shards is not None else args.output
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    out_fh = out_path.open("w", encoding="utf-8") if out_path else None
    try:
        bar = tqdm(total=len(items), desc=f"scoring with {args.reward}", unit="img", delay=1.0,
                   disable=args.no_progress, file=sys.stderr)
        for s in range(0, len(items), args.batch_size):
            chunk = items[s:s + args.batch_size]
            try:
                out = reward([it["image"] for it in chunk], [it["prompt"] for it in chunk],
                             sources=[it["sources"] or [] for it in chunk] if has_sources else None,
                             metadata=[it["metadata"] for it in chunk] if any(it["metadata"] for it in chunk)
                             else None, on_error=args.on_error)
            except RewardInputError as exc:  # --on-error raise: name the sample in the whole input, and its file
                if exc.index is None or not 0 <= exc.index < len(chunk):
                    raise
                raise UsageError(f"{_describe(chunk[exc.index], s + exc.index)}: {exc.reason}") from None
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
        from ..distributed import exit_together, gather_objects

        counts = gather_objects((n_bad, len(results)))  # every rank: the whole run's counts
        n_bad, n_all = sum(c[0] for c in counts), sum(c[1] for c in counts)
        results = shards.merge(results, args.output)
        if results is None:  # the other ranks exit with rank 0's code (torchrun reports the first non-zero)
            return exit_together(invalid_code(n_bad, n_all))
    width = max((len(r["image"]) for r in results), default=5)
    print(f"{'image'.ljust(width)}  score")
    for r in results:
        score = f"{r['score']:.6g}" if r["valid"] else f"NaN  ({r['error']})"
        print(f"{r['image'].ljust(width)}  {score}")
    if args.output:
        print(f"wrote {count(len(results), 'result')} to {args.output}", file=sys.stderr)
    code = invalid_summary(n_bad, len(results), "images")
    if shards is not None:
        from ..distributed import exit_together

        return exit_together(code)
    return code
