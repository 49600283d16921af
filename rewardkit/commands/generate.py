"""``rewardkit generate``: images of a diffusers pipeline for a prompt metadata file, in GenEval's layout, sharded
over torchrun's processes.

The layout is the one djghosh13/geneval @ af4902f ``generation/diffusers_generate.py:115-147`` writes and
``evaluation/evaluate_images.py`` reads (and ``rewardkit bench geneval`` scores)::

    OUTDIR/00000/metadata.jsonl     the prompt's metadata row (one JSON object, json.dump as there)
    OUTDIR/00000/samples/00000.png  ... --n-samples images
    OUTDIR/00001/...

Like the official script every prompt starts from the same seed (``seed_everything(opt.seed)`` per prompt,
``:116``; here a ``torch.Generator`` seeded with ``--seed`` per prompt), so a prompt's images do not depend on
the number of processes or on which one draws them. Under ``torchrun --nproc_per_node N`` process ``r`` draws
the prompts ``i`` with ``i % N == r``. A prompt folder that already holds all its samples is skipped (a rerun
resumes). The official script's defaults are SD 1.5's (50 steps, guidance 9, 4 samples); pass the generator's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from . import EXIT_CODES_HELP, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate", help="images of a diffusers pipeline for GenEval's prompts, in GenEval's folder layout",
        description="Generate images with a diffusers pipeline for every row of a prompt metadata file (GenEval's "
                    "prompts/evaluation_metadata.jsonl or any JSONL with 'prompt'), in the layout `rewardkit "
                    "bench geneval --images` reads. Examples:\n"
                    "  rewardkit generate --model stabilityai/stable-diffusion-3.5-medium \\\n"
                    "      --metadata evaluation_metadata.jsonl --outdir outputs --steps 40 --guidance 4.5\n"
                    "  torchrun --nproc_per_node 8 -m rewardkit.cli generate --model ... --outdir outputs\n"
                    "  rewardkit bench geneval --images outputs",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", "-m", required=True, help="diffusers pipeline: hub id or local directory")
    p.add_argument("--metadata", required=True, type=Path, help="JSONL, one object with a string 'prompt' a line")
    p.add_argument("--outdir", "-o", type=Path, default=Path("outputs"), help="default ./outputs")
    p.add_argument("--lora", help="a LoRA to load into the pipeline (load_lora_weights), e.g. a trained "
                                  "`rewardkit rl nft` checkpoint's lora folder")
    p.add_argument("--n-samples", type=int, default=4, help="images per prompt (default 4, as GenEval)")
    p.add_argument("--steps", type=int, default=50, help="num_inference_steps (default 50)")
    p.add_argument("--guidance", type=float, default=9.0, help="guidance_scale (default 9.0, GenEval's)")
    p.add_argument("--height", type=int, help="image height (default: the pipeline's)")
    p.add_argument("--width", type=int, help="image width (default: the pipeline's)")
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--seed", type=int, default=42, help="the seed of every prompt (default 42, GenEval's)")
    p.add_argument("--batch-size", type=int, default=1, help="images per pipeline call (default 1)")
    p.add_argument("--max-sequence-length", type=int,
                   help="the T5 prompt length of pipelines that take one (SD3, Flux)")
    p.add_argument("--device", help="torch device (default: cuda:LOCAL_RANK when CUDA is available, else cpu)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="pipeline dtype (default float16 on CUDA, float32 on CPU)")
    p.add_argument("--limit", type=int, help="the first N prompts only (smoke runs)")


def read_rows(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
                raise UsageError(f"{path}:{i}: expected an object with a non-empty string 'prompt'")
            rows.append(row)
    if not rows:
        raise UsageError(f"{path}: no prompts")
    return rows[:limit] if limit else rows


def my_prompts(n: int, rank: int, world: int) -> list[int]:
    """The prompt indices process ``rank`` of ``world`` draws: ``i % world == rank``."""
    return list(range(rank, n, world))


def generate_layout(pipe: Any, rows: Sequence[dict[str, Any]], outdir: Path, indices: Sequence[int], *,
                    n_samples: int, steps: int, guidance: float, seed: int, batch_size: int = 1,
                    height: int | None = None, width: int | None = None, negative_prompt: str | None = None,
                    extra: dict[str, Any] | None = None, log: Any = None) -> int:
    """Write the folders of ``indices`` (see the module docstring); returns the number of images written."""
    import torch

    written = 0
    for index in indices:
        meta = rows[index]
        folder = Path(outdir) / f"{index:0>5}"
        samples = folder / "samples"
        if all((samples / f"{k:05}.png").is_file() for k in range(n_samples)):
            continue
        samples.mkdir(parents=True, exist_ok=True)
        with open(folder / "metadata.jsonl", "w", encoding="utf-8") as fh:
            json.dump(meta, fh)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        count = 0
        while count < n_samples:
            k = min(batch_size, n_samples - count)
            # CPU generator: the same draws on any device, and the same images for a prompt on any rank
            images = pipe(meta["prompt"], height=height, width=width, num_inference_steps=steps,
                          guidance_scale=guidance, num_images_per_prompt=k, negative_prompt=negative_prompt,
                          generator=gen, **(extra or {})).images
            for im in images:
                tmp = samples / f".{count:05}.png.tmp"
                im.save(tmp, format="PNG")
                tmp.replace(samples / f"{count:05}.png")
                count += 1
                written += 1
        if log is not None:
            log(f"prompt {index:>5}: {meta['prompt']!r}")
    return written


def run(args: argparse.Namespace) -> int:
    if min(args.n_samples, args.steps, args.batch_size) < 1 or (args.limit is not None and args.limit < 1):
        raise UsageError("--n-samples, --steps, --batch-size and --limit must be >= 1")
    if not args.metadata.is_file():
        raise UsageError(f"no metadata file {args.metadata}")
    rows = read_rows(args.metadata, args.limit)

    import torch

    from .. import distributed
    from .._imports import require

    distributed.init_from_env()
    rank, world = distributed.rank(), distributed.world_size()
    device = distributed.local_device(args.device) or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float16 if str(device).startswith("cuda")
                                                           else torch.float32)
    diffusers = require("diffusers", "rl", "rewardkit generate")
    pipe = diffusers.DiffusionPipeline.from_pretrained(args.model, torch_dtype=dtype, use_safetensors=True)
    if args.lora:
        pipe.load_lora_weights(args.lora)
    pipe = pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    extra = {"max_sequence_length": args.max_sequence_length} if args.max_sequence_length else None
    mine = my_prompts(len(rows), rank, world)
    log = (lambda m: print(m, file=sys.stderr)) if rank == 0 else None
    with torch.inference_mode():
        n = generate_layout(pipe, rows, args.outdir, mine, n_samples=args.n_samples, steps=args.steps,
                            guidance=args.guidance, seed=args.seed, batch_size=args.batch_size,
                            height=args.height, width=args.width, negative_prompt=args.negative_prompt,
                            extra=extra, log=log)
    print(f"rank {rank}/{world}: wrote {n} images for {len(mine)} prompts under {args.outdir}", file=sys.stderr)
    distributed.barrier()
    if rank == 0:
        print(f"next: rewardkit bench geneval --images {args.outdir}", file=sys.stderr)
    return 0
