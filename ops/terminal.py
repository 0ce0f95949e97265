"""What the commands print on: the console for their tables, and a live progress line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console


def console() -> Console:
    # Not a terminal (a file, a pipe, docs): wide enough for the tables, no colour codes.
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 220)
    return Console(width=width, highlight=False)


@contextmanager
def progress_line(args: argparse.Namespace) -> Iterator[Callable[[str], None]]:
    """A live line on the terminal (stderr) while a command works, gone when it ends: nothing
    with --json, or when stderr is not a terminal (a pipe, a file, a CI log)."""
    if getattr(args, "json", False) or not sys.stderr.isatty():
        yield lambda message: None
        return
    with Console(stderr=True).status("starting", spinner="line") as live:
        yield live.update
