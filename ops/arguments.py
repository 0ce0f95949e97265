"""Arguments the subcommands share."""

from __future__ import annotations

import argparse
from pathlib import Path

from .stack import REPO


def common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Options taken before or after the subcommand (as pulumi takes -s anywhere)."""
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parser.add_argument("-s", "--stack", default=default(None),
                        help="the stack to read (default: the currently selected stack)")
    parser.add_argument("--cwd", type=Path, default=default(REPO), metavar="DIR",
                        help="the Pulumi project directory, where pulumi runs (default: this "
                             "repository)")
    # Tests inject the stack instead of running pulumi: `pulumi stack output --json` and
    # `pulumi config --json` (or {key: value}) as files.
    parser.add_argument("--outputs-json", type=Path, default=default(None), help=argparse.SUPPRESS)
    parser.add_argument("--config-json", type=Path, default=default(None), help=argparse.SUPPRESS)
    parser.add_argument("--state-json", type=Path, default=default(None), help=argparse.SUPPRESS)


def positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
    return number


def not_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is negative")
    return number
