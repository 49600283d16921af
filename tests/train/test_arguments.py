"""`rewardkit train preference`'s options are declared once: the CLI and `rewardkit.train.trainer.add_arguments`
(for users' own scripts) were two copies that drifted (the trainer's lacked --no-progress)."""

from __future__ import annotations

import argparse
import contextlib
import io

import yaml

from rewardkit.commands.train import KINDS
from rewardkit.train.trainer import add_arguments, run_cli


def _options(declare) -> list[tuple]:
    p = argparse.ArgumentParser()
    declare(p)
    return sorted((tuple(a.option_strings), a.dest, a.nargs) for a in p._actions)


def test_the_cli_and_add_arguments_declare_the_same_options():
    assert _options(KINDS["preference"][2]) == _options(add_arguments)
    assert ("--no-progress",) in [o[0] for o in _options(add_arguments)]


def test_run_cli_from_your_own_script_honours_no_progress():
    p = argparse.ArgumentParser()
    add_arguments(p)
    for flags, expected in ((["--print-config"], True), (["--print-config", "--no-progress"], False)):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert run_cli(p.parse_args(flags)) == 0
        assert yaml.safe_load(buf.getvalue())["progress"] is expected
