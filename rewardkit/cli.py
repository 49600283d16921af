"""The ``rewardkit`` console script: ``rewardkit ls | score | bench | train | soup | ...``.

Each subcommand lives in ``rewardkit/commands/<name>.py`` with two functions, ``add_parser(subparsers)``
and ``run(args) -> int``; command modules are cheap to import (heavy libraries load inside ``run``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ._version import __version__
from .errors import ConfigError, MissingDependencyError, RegistryError, RewardInputError

# name -> module; add a line here to add a subcommand.
COMMANDS: dict[str, str] = {
    "bench": "rewardkit.commands.bench",
    "calibrate": "rewardkit.commands.calibrate",
    "ls": "rewardkit.commands.ls",
    "score": "rewardkit.commands.score",
    "soup": "rewardkit.commands.soup",
    "compose": "rewardkit.commands.compose",
    "train": "rewardkit.commands.train",
    "parrot": "rewardkit.commands.parrot",
    "refine": "rewardkit.commands.refine",
    # (other issues add: bench, train, soup, calibrate)
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rewardkit",
        description="Reward models for image generation: score images, benchmark rewards, train reward models.",
    )
    parser.add_argument("--version", action="version", version=f"rewardkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    # Our own progress bars report the work; silence the Hub/transformers download and loading bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    module = importlib.import_module(COMMANDS[args.command])
    try:
        return int(module.run(args) or 0)
    except MissingDependencyError as exc:
        print(f"rewardkit {args.command}: {exc}", file=sys.stderr)
        return 2
    except (RegistryError, ConfigError, RewardInputError, FileNotFoundError) as exc:
        print(f"rewardkit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # bad options or unreadable checkpoints: a message, not a traceback
        if os.environ.get("REWARDKIT_DEBUG"):
            raise
        print(f"rewardkit {args.command}: error: {type(exc).__name__}: {exc}\n"
              "(set REWARDKIT_DEBUG=1 to see the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rewardkit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
