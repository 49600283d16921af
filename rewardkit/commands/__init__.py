"""Shared pieces of the ``rewardkit`` subcommands: exit codes and the usage-error type.

Kept import-free (standard library only): ``rewardkit --help`` imports every command module.
"""

from __future__ import annotations

# Exit codes, the same for every command (documented in ``rewardkit --help`` and the README).
EXIT_OK = 0            # everything asked for was done; every sample scored
EXIT_INTERNAL = 1      # a bug or an unexpected failure (a traceback with REWARDKIT_DEBUG=1)
EXIT_USAGE = 2         # usage or input error: bad option, missing / unreadable file, bad config, nothing to do
EXIT_INVALID = 3       # the run finished but some (or all) samples could not be scored: see the summary

EXIT_CODES_HELP = (
    "exit codes: 0 every sample scored; 1 internal error; 2 usage or input error (bad option, missing or\n"
    "unreadable file, bad config, empty input); 3 finished, but some or all samples could not be scored")


# defined with the other errors, so that library code below the commands (e.g. a dataset reader) can raise it
from ..errors import UsageError  # noqa: E402,F401


def count(n: int, noun: str) -> str:
    """``"1 result"``, ``"2 results"``: a count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def invalid_code(n_bad: int, n_total: int) -> int:
    """The exit code of a run that scored ``n_total`` samples, ``n_bad`` of them invalid (what
    :func:`invalid_summary` returns, without its line: for the ranks that do not print)."""
    return EXIT_USAGE if n_total == 0 else EXIT_OK if n_bad == 0 else EXIT_INVALID


def invalid_summary(n_bad: int, n_total: int, what: str = "samples") -> int:
    """Print the "N of M invalid" line to stderr and return the exit code for it (:func:`invalid_code`)."""
    import sys

    if n_total == 0:
        print(f"no {what} to score", file=sys.stderr)
    elif n_bad == 0:
        print(f"all {n_total} {what} scored" if n_total > 1 else f"the one {what.rstrip('s')} was scored",
              file=sys.stderr)
    if n_bad == n_total:
        print(f"error: none of the {n_total} {what} could be scored (every one invalid; reasons above)"
              if n_total > 1 else f"error: the one {what.rstrip('s')} could not be scored (reason above)",
              file=sys.stderr)
    else:
        print(f"{n_bad} of {n_total} {what} invalid (could not be scored; reasons above)", file=sys.stderr)
    return invalid_code(n_bad, n_total)
