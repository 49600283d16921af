"""`rewardkit refine`: generate-critique-refine with a diffusers pipeline (or a Python callable) and a
reasoning reward (`rational` by default).

    rewardkit refine --generator diffusers:stabilityai/stable-diffusion-3.5-medium \\
        --critic-model runs/parrot-qwen3vl/student --prompt "a red bicycle" --prompt "a sign saying OPEN" -o gcr/
    rewardkit refine --generator mypkg.gen:generate --prompts prompts.txt --critic-model ./student -o gcr/

Writes `<out>/before/NNNNN.png`, `<out>/after/NNNNN.png` and `<out>/records.jsonl` (prompt, status,
scores before / after, refined prompts, errors). Exits 3 when some or all images could not be critiqued
(status `critique_failed`, or a regenerated image whose critique failed: `error_after`; the records say why),
0 when every one was. `--gen KEY=VALUE` passes pipeline options
(num_inference_steps=28 guidance_scale=4.5 ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import UsageError, invalid_summary


def add_parser(sub) -> None:
    p = sub.add_parser("refine", help="generate-critique-refine (test-time prompt tuning with a reasoning reward)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", "-g", required=True,
                   help="diffusers:<pipeline dir or hub id>, or module:function (called as f(prompts, sources=, seed=))")
    p.add_argument("--prompt", "-p", action="append", default=[], help="a request (repeatable)")
    p.add_argument("--prompts", type=Path, help="text file, one request per line")
    p.add_argument("--critic", "-r", default="rational", help="critic reward (default rational)")
    p.add_argument("--critic-model", help="the critic's model (e.g. the PARROT student directory)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="critic options, e.g. --set max_new_tokens=1024 judge_kwargs.model=...")
    p.add_argument("--gen", dest="gen_kwargs", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="generator (pipeline call) options, e.g. --gen num_inference_steps=28")
    p.add_argument("--threshold", type=float, default=3.0, help="refine when an applicable dimension is below (3.0)")
    p.add_argument("--iterations", type=int, default=1, help="refinement rounds (default 1, the paper's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="torch device for the pipeline and critic")
    p.add_argument("--dtype", help="pipeline / critic dtype (float32, bfloat16, float16)")
    p.add_argument("--batch-size", type=int, default=None, help="critic batch size")
    p.add_argument("--output", "-o", type=Path, required=True, help="output folder")


def _generator(spec: str, gen_kwargs: dict, device: str | None, dtype: str | None):
    import importlib

    from ..refine import DiffusersGenerator

    kind, sep, target = spec.partition(":")
    if kind == "diffusers" and target:
        from .._imports import require
        from ..models.vlm import resolve_dtype

        diffusers = require("diffusers", "rl")
        pipe = diffusers.DiffusionPipeline.from_pretrained(target, torch_dtype=resolve_dtype(dtype), use_safetensors=True)
        if device:
            pipe.to(device)
        return DiffusersGenerator(pipe, **gen_kwargs)
    if sep and target:
        fn = getattr(importlib.import_module(kind), target)
        return (lambda prompts, sources=None, seed=None: fn(prompts, sources=sources, seed=seed, **gen_kwargs))
    raise UsageError(f"cannot read generator {spec!r}: use diffusers:<path> or module:function")


def run(args: argparse.Namespace) -> int:
    import rewardkit

    from ..config import parse_overrides
    from ..refine import refine

    prompts = list(args.prompt)
    if args.prompts is not None:
        prompts += [ln.strip() for ln in args.prompts.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not prompts:
        raise UsageError("give requests with --prompt or --prompts FILE")
    kw = parse_overrides(args.overrides)
    if args.critic_model:
        kw.setdefault("model", args.critic_model)
    if args.device:
        kw.setdefault("device", args.device)
    if args.dtype:
        kw.setdefault("dtype", args.dtype)
    critic = rewardkit.load_reward(args.critic, **kw)
    gen = _generator(args.generator, parse_overrides(args.gen_kwargs), args.device, args.dtype)
    res = refine(gen, prompts, critic=critic, threshold=args.threshold, iterations=args.iterations, seed=args.seed,
                 batch_size=args.batch_size)
    from .. import media

    out = args.output
    (out / "before").mkdir(parents=True, exist_ok=True)
    (out / "after").mkdir(parents=True, exist_ok=True)
    tmp = out / "records.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for i, (rec, b, a) in enumerate(zip(res.records, res.images_before, res.images_after)):
            media.to_pil(b).save(out / "before" / f"{i:05d}.png")
            media.to_pil(a).save(out / "after" / f"{i:05d}.png")
            f.write(json.dumps({"index": i, **rec}) + "\n")
    tmp.replace(out / "records.jsonl")
    counts: dict[str, int] = {}
    for r in res.records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(json.dumps({"prompts": len(prompts), "status": counts, "output": str(out)}))
    for i, r in enumerate(res.records):  # each image the critic could not critique, with the critic's reason
        for when in ("before", "after"):
            err = r.get(f"error_{when}")
            if err is not None and (when == "before" or r["status"] == "refined"):
                print(f"image {i} ({when}, prompt {r['prompt'][:60]!r}): not critiqued: {err}", file=sys.stderr)
    # an image the critic could not critique was not judged: exit 3 when any (or every) one failed, the first
    # image (status critique_failed) or the regenerated one (a refined sample whose after-critique failed)
    bad = sum(r["status"] == "critique_failed" or r.get("error_after") is not None for r in res.records)
    return invalid_summary(bad, len(res.records), "images")
