"""The ``rewardkit`` console script: ``rewardkit ls | score | compare | bench | train | soup | ...``.

Each subcommand lives in ``rewardkit/commands/<name>.py`` with two functions, ``add_parser(subparsers)``
and ``run(args) -> int``. Command modules must stay cheap to import (standard library only at module
level; torch, transformers and the rest load inside ``run``): ``rewardkit --help`` imports all of them, and
``tests/cli/test_help_imports.py`` checks that it imports no heavy module.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ._version import __version__
from .commands import EXIT_CODES_HELP, EXIT_INTERNAL, EXIT_USAGE, UsageError
from .errors import ConfigError, MissingDependencyError, RegistryError, RewardInputError

# name -> module; add a line here to add a subcommand.
COMMANDS: dict[str, str] = {
    "ls": "rewardkit.commands.ls",
    "score": "rewardkit.commands.score",
    "compare": "rewardkit.commands.compare",
    "bench": "rewardkit.commands.bench",
    "generate": "rewardkit.commands.generate",
    "calibrate": "rewardkit.commands.calibrate",
    "compose": "rewardkit.commands.compose",
    "convert": "rewardkit.commands.convert",
    "train": "rewardkit.commands.train",
    "rl": "rewardkit.commands.rl",
    "soup": "rewardkit.commands.soup",
    "serve": "rewardkit.commands.serve",
    "parrot": "rewardkit.commands.parrot",
    "refine": "rewardkit.commands.refine",
    "view": "rewardkit.commands.view",
    "filter": "rewardkit.commands.filter",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rewardkit",
        description="Reward models for image generation: score images, benchmark rewards, train reward models.",
        epilog=EXIT_CODES_HELP + "\n\nenvironment: HF_HUB_OFFLINE=1 never touches the network; "
               "REWARDKIT_DEBUG=1 shows tracebacks (exit codes unchanged).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rewardkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    return parser


def _fail(command: str, message: str, code: int) -> int:
    print(f"rewardkit {command}: error: {message}", file=sys.stderr)
    return code


def debug_enabled() -> bool:
    """``REWARDKIT_DEBUG`` set to anything but empty / ``0`` / ``false`` / ``no`` / ``off``."""
    return os.environ.get("REWARDKIT_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def _traceback(command: str, message: str, code: int) -> int:
    """Debug mode: the full traceback, then the same one-line error and the same exit code as without it."""
    import traceback

    traceback.print_exc()
    return _fail(command, message, code)


def main(argv: list[str] | None = None) -> int:
    # Our own progress bars report the work; silence the Hub/transformers download and loading bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints them and exits 2
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    module = importlib.import_module(COMMANDS[args.command])
    debug = debug_enabled()
    fail = _traceback if debug else _fail
    try:
        return int(module.run(args) or 0)
    except SystemExit as exc:  # a message from a command (or a library) is a usage error, a number is kept
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        msg = str(exc.code)
        prefix = f"rewardkit {args.command}: "
        print(msg if msg.startswith("rewardkit ") else prefix + msg, file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"rewardkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except MissingDependencyError as exc:
        return _fail(args.command, str(exc), EXIT_USAGE)
    # debug mode prints the traceback first; the exit code stays what it is without it (2 stays 2)
    except (UsageError, RegistryError, ConfigError, RewardInputError, FileNotFoundError, NotADirectoryError) as exc:
        return fail(args.command, str(exc), EXIT_USAGE)
    except (ValueError, OSError) as exc:  # bad option values, unreadable checkpoints: a message, not a traceback
        hint = "" if debug else "\n(set REWARDKIT_DEBUG=1 to see the traceback)"
        return fail(args.command, f"{type(exc).__name__}: {exc}{hint}", EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001  anything else is our bug: say so, keep the code distinct
        if type(exc).__name__ == "SafetensorError":  # a weights file that is not one (e.g. a renamed pickle)
            return fail(args.command, f"a weights file is not a readable safetensors file ({exc}); rewardkit reads "
                                      "safetensors only and never unpickles a file by another name", EXIT_USAGE)
        hint = "please report it" if debug else "set REWARDKIT_DEBUG=1 to see the traceback; please report it"
        return fail(args.command, f"internal error: {type(exc).__name__}: {exc}\n({hint})", EXIT_INTERNAL)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
