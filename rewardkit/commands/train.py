"""``rewardkit train KIND --config recipe.yaml [key=value ...]``: train a reward model.

One sub-subcommand per kind of model. Each kind is a module with ``add_arguments(parser)`` and
``run_cli(args) -> int``; add a line to ``KINDS`` to add one. Modules load only when their kind runs.

    rewardkit train preference --config recipes/arena_rm/tiny.yaml output_dir=runs/tiny
    torchrun --nproc_per_node 8 -m rewardkit.cli train preference --config recipes/arena_rm/qwen3_vl_8b.yaml
"""

from __future__ import annotations

import argparse
import importlib

# kind -> module providing add_arguments(parser) and run_cli(args)
KINDS: dict[str, tuple[str, str]] = {
    "preference": ("rewardkit.train.trainer", "Bradley-Terry preference reward on a VLM (Arena RM recipe)"),
}


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a reward model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="train_kind", metavar="KIND")
    for kind, (module, help_text) in KINDS.items():
        kp = kinds.add_parser(kind, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(kp)


def run(args: argparse.Namespace) -> int:
    kind = getattr(args, "train_kind", None)
    if not kind:
        print("usage: rewardkit train KIND ...; kinds: " + ", ".join(KINDS))
        return 2
    return int(importlib.import_module(KINDS[kind][0]).run_cli(args) or 0)
