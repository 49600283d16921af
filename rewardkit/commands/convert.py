"""``rewardkit convert KIND SRC DST``: convert an official reward checkpoint (once, offline) to a rewardkit
directory that ``load_reward(KIND, model=DST)`` reads (safetensors only at run time)."""

from __future__ import annotations

import argparse

KINDS = ("hpsv2", "aesthetic", "imagereward", "hpsv3", "editreward", "geneval")


def add_parser(sub) -> None:
    p = sub.add_parser("convert",
                       help="convert an official reward checkpoint (HPSv2, aesthetic, ImageReward, HPSv3, EditReward, GenEval)",
                       description="Convert an official reward checkpoint to a rewardkit directory. Pickled "
                                   "sources are scanned against an allow-list (tensors, storages, ordered dicts) and "
                                   "read with torch's weights-only unpickler; anything else is refused. See "
                                   "docs/zoo.md.")
    p.add_argument("kind", choices=KINDS, help="which reward the checkpoint belongs to")
    p.add_argument("src", help="the official checkpoint file (.pt / .pth / .safetensors)")
    p.add_argument("dst", help="output directory (created atomically)")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.add_argument("--tokenizer", help="hpsv2: OpenCLIP tokenizer (default laion/CLIP-ViT-H-14-laion2B-s32B-b79K); "
                                       "imagereward: BERT tokenizer (default bert-base-uncased)")
    p.add_argument("--heads", help="hpsv2: attention heads VISION,TEXT (default 16,16 for ViT-H-14)")
    p.add_argument("--version", help="hpsv2: v2.0 or v2.1 (default: from the file name)")
    p.add_argument("--dtype", help="hpsv2: cast weights to float16 / float32 (default: keep)")
    p.add_argument("--clip", help="aesthetic / geneval: CLIP ViT-L/14 checkpoint (default openai/clip-vit-large-patch14)")
    p.add_argument("--base", help="hpsv3 / editreward: base model for config + processor (default Qwen/Qwen2-VL-7B-Instruct / Qwen/Qwen2.5-VL-7B-Instruct)")
    p.add_argument("--med-config", help="imagereward: med_config.json of the BLIP text encoder (default: "
                                        "the published values)")


def run(args: argparse.Namespace) -> int:
    from ..convert import convert

    opts: dict = {"overwrite": args.overwrite}
    if args.kind == "hpsv2":
        if args.tokenizer:
            opts["tokenizer"] = args.tokenizer
        if args.heads:
            try:
                opts["vision_heads"], opts["text_heads"] = (int(x) for x in args.heads.split(","))
            except ValueError:
                raise ValueError(f"--heads must be VISION,TEXT (two integers), got {args.heads!r}") from None
        if args.version:
            opts["version"] = args.version
        if args.dtype:
            opts["dtype"] = args.dtype
    elif args.kind in ("aesthetic", "geneval"):
        if args.clip:
            opts["clip"] = args.clip
    elif args.kind == "imagereward":
        if args.tokenizer:
            opts["tokenizer"] = args.tokenizer
        if args.med_config:
            opts["med_config"] = args.med_config
    elif args.kind in ("hpsv3", "editreward"):
        if args.base:
            opts["base"] = args.base
    out = convert(args.kind, args.src, args.dst, **opts)
    print(f"wrote {out}  (load it with load_reward({args.kind!r}, model={str(out)!r}))")
    return 0
