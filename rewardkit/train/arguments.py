"""The command-line options of ``rewardkit train preference``, declared once: the CLI (``rewardkit.commands.train``)
and your own script (``rewardkit.train.trainer.add_arguments``) use this function. Light on purpose: ``rewardkit
--help`` imports it, never the trainer (torch included)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["preference_arguments"]


def preference_arguments(p: argparse.ArgumentParser) -> None:
    """Declare the options of ``rewardkit train preference`` on ``p`` (read back by ``trainer.run_cli(args)``)."""
    p.add_argument("--config", "-c", type=Path, help="recipe YAML (see recipes/arena_rm/)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides, e.g. optim.lr=1e-5 output_dir=runs/x lora.enabled=true")
    p.add_argument("--output-dir", help="shortcut for output_dir=...")
    p.add_argument("--resume", help="auto (default), never, or a checkpoint directory")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (defaults + --config + overrides) as YAML and exit")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar (same as progress=false)")
