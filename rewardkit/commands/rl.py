"""rewardkit rl nft --config recipes/nft/NAME.yaml [key=value ...]: the bundled DiffusionNFT trainer.

DiffusionNFT (online RL on the forward process) for SD3 / SD3.5 with LoRA, on any rewardkit reward, with
optional E²PO embedding-perturbed exploration (e2po.enabled=true). Examples:

    rewardkit rl nft --config recipes/nft/tiny.yaml                       # CPU, under 2 minutes
    torchrun --standalone --nproc_per_node 2 -m rewardkit.cli rl nft --config recipes/nft/tiny.yaml output_dir=runs/nft_tiny_2proc
    rewardkit rl nft --config recipes/nft/tiny_e2po.yaml
    rewardkit rl nft --config recipes/nft/sd35m_pickscore.yaml output_dir=runs/pick_1gpu train.lr=1e-4
    torchrun --nproc_per_node 8 -m rewardkit.cli rl nft --config recipes/nft/sd35m_pickscore.yaml
    rewardkit rl nft --preset e2po_pickscore_k3 --print-config            # the seed paper's PickScore setting

Config layers: defaults < --preset < --config < key=value; sections merge key by key, but a `rewards` mapping
replaces the one before it (rewards.NAME=W edits one entry). Outputs in output_dir: metrics.jsonl (per epoch),
steps.jsonl (per optimizer step), curves.png, eval-epoch-N.png (evaluation grids), tensorboard/ (report_to),
lora/ (pytorch_lora_weights.safetensors, loadable with StableDiffusion3Pipeline.load_lora_weights),
checkpoints/ (resumable; a checkpoint resumes only with the process count that wrote it), config.yaml.
See docs/rl.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import EXIT_CODES_HELP, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("rl", help="reinforcement learning of image generators on rewardkit rewards (DiffusionNFT)",
                       description=__doc__, epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    algos = p.add_subparsers(dest="rl_algo", metavar="ALGO")
    n = algos.add_parser("nft", help="DiffusionNFT with optional E²PO exploration (SD3 / SD3.5, LoRA)",
                         description=__doc__, epilog=EXIT_CODES_HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    n.add_argument("--config", "-c", type=Path, help="recipe YAML (see recipes/nft/)")
    n.add_argument("--preset", help="start from a named preset (geneval, pickscore, hpsv2, ocr, multi_reward, "
                                    "e2po_geneval_k12, e2po_geneval_k4, e2po_pickscore_k3); --config and "
                                    "overrides apply on top")
    n.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides, e.g. train.lr=1e-4 sample.num_steps=10 e2po.enabled=true")
    n.add_argument("--output-dir", help="shortcut for output_dir=...")
    n.add_argument("--resume", help="auto (default), never, or a checkpoint directory")
    n.add_argument("--print-config", action="store_true",
                   help="print the resolved config (defaults + preset + --config + overrides) as YAML and exit")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "rl_algo", None) != "nft":
        raise UsageError("give an algorithm: rewardkit rl nft --config recipe.yaml [key=value ...]")
    if args.config is not None and not Path(args.config).is_file():
        raise UsageError(f"--config {args.config}: no such file")
    import dataclasses
    import json
    import math
    import os

    from ..config import _merge, _read_yaml, build_config, parse_overrides
    from ..rl.config import NFTConfig, preset

    data = preset(args.preset) if args.preset else {}
    if args.config is not None:
        data = _merge(data, _read_yaml(args.config), NFTConfig)  # rewards: {...} replaces
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.resume:
        overrides.append(f"resume={args.resume}")
    cfg = build_config(NFTConfig, data, parse_overrides(overrides, patches=True))
    if args.print_config:
        import yaml

        print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
        return 0
    cfg.validate()
    from ..registry import resolve_name

    for name in cfg.rewards:  # an unknown or refused name (with the reason) exits 2 before anything loads
        resolve_name(name)
    from .._imports import require

    for module in ("diffusers", "peft"):  # the rl extra, before the reward (a model load) is built
        require(module, "rl", "rewardkit rl nft")
    from ..rl.trainer import train_nft

    summary = train_nft(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, float) or math.isfinite(v)}))
    return 0
