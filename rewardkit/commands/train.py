"""``rewardkit train KIND --config recipe.yaml [key=value ...]``: train a reward model.

One sub-subcommand per kind of model: ``KINDS`` maps a kind to the module with its ``run_cli(args)`` and to a
function here that declares its options (so ``rewardkit --help`` never imports the trainer, torch included).
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from ..train.arguments import preference_arguments
from . import EXIT_CODES_HELP, UsageError

PREFERENCE_HELP = """Train a Bradley-Terry preference reward on a vision-language model (Arena RM recipe).
Examples:
  rewardkit train preference --config recipes/arena_rm/tiny.yaml output_dir=runs/arena_tiny
  torchrun --nproc_per_node 2 -m rewardkit.cli train preference --config recipes/arena_rm/tiny.yaml
Outputs in output_dir: metrics.jsonl, checkpoints/ (resumable), model/ (load it with
--reward preference --model OUTPUT_DIR/model), config.yaml."""


# kind -> (module providing run_cli(args), help text, argument declarations)
KINDS = {
    "preference": ("rewardkit.train.trainer", "Bradley-Terry preference reward on a VLM (Arena RM recipe)",
                   preference_arguments, PREFERENCE_HELP),
}


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a reward model", description="Train a reward model. Kinds: "
                       + ", ".join(KINDS), epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="train_kind", metavar="KIND")
    for kind, (_module, help_text, declare, description) in KINDS.items():
        kp = kinds.add_parser(kind, help=help_text, description=description, epilog=EXIT_CODES_HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        declare(kp)


def run(args: argparse.Namespace) -> int:
    kind = getattr(args, "train_kind", None)
    if not kind:
        raise UsageError("give a kind: rewardkit train KIND ...; kinds: " + ", ".join(KINDS))
    if args.config is not None and not Path(args.config).is_file():
        raise UsageError(f"--config {args.config}: no such file")
    if not args.print_config:
        import sys

        print(f"train {kind}: config {args.config or '(defaults)'}"
              + (f" + {' '.join(args.overrides)}" if args.overrides else "")
              + "; loading the trainer and the backbone ...", file=sys.stderr, flush=True)
    return int(importlib.import_module(KINDS[kind][0]).run_cli(args) or 0)
