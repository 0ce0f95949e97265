"""`scripts/kimipd up` / `preview`: the engine's update or preview of a stack, with the nodes out
left out (ops/node_out.py), the policy pack named and a change of contract noted."""

from __future__ import annotations

import argparse
import sys

from pulumi import automation as auto

from . import DOWN
from .node_out import OutUpdate
from .stack import StackError
from .stack_engine import StackEngine, engine_error_hint


def run_engine(args: argparse.Namespace) -> int:
    """`kimipd up` / `kimipd preview` (ops/node_out.py)."""
    try:
        update = OutUpdate(StackEngine(args.stack, args.cwd))
        if args.command == "preview":
            return update.preview(args.diff)
        return update.up(args.diff, args.yes, args.message)
    except (StackError, auto.CommandError) as error:
        print(f"kimipd {args.command}: {str(error).strip()[-2000:]}", file=sys.stderr)
        hint = engine_error_hint(str(error))
        if hint is not None:
            print(f"kimipd {args.command}: {hint}", file=sys.stderr)
        return DOWN
