"""`scripts/kimipd up` / `preview`: the engine's update or preview of a stack, with the nodes out
left out (ops/node_out.py), the policy pack named and a change of contract noted."""

from __future__ import annotations

import argparse
from pathlib import Path
import signal
import sys
import threading

from pulumi import automation as auto

from . import DOWN
from .node_out import OutUpdate
from .remote import RemoteError, SshTransport
from .rollout import stop
from .stack import StackError, load_stack
from .stack_engine import StackEngine, engine_error_hint


def stop_on_interrupt(stack: str, cwd: Path) -> None:
    """`kimipd up`'s first Ctrl-C (the engine gets its own and stops starting steps) also asks
    the node scripts that wait in this update to stop (`kimipd rollout stop`): the steps running
    end within seconds instead of at their waits' bounds. A second Ctrl-C interrupts as
    Python does."""

    def stop_nodes() -> None:
        try:
            loaded = load_stack(stack, cwd, None, None)
            door = loaded.topology.door
            if door is None or door.state_dir is None:
                return
            transport = SshTransport(loaded.access, connect_timeout=10.0)
            try:
                print(f"kimipd up: {stop(transport, door, 30.0)}", file=sys.stderr)
            finally:
                transport.close()
        except (StackError, RemoteError) as error:
            print(f"kimipd up: the node scripts were not asked to stop ({error}); run "
                  f"`scripts/kimipd -s {stack} rollout stop`", file=sys.stderr)

    def interrupted(_signal: int, _frame: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("kimipd up: interrupted; asking the update's node scripts to stop waiting (Ctrl-C "
              "again to leave now)", file=sys.stderr)
        threading.Thread(target=stop_nodes, daemon=True).start()

    signal.signal(signal.SIGINT, interrupted)


def run_engine(args: argparse.Namespace) -> int:
    """`kimipd up` / `kimipd preview` (ops/node_out.py)."""
    try:
        update = OutUpdate(StackEngine(args.stack, args.cwd))
        if args.command == "preview":
            return update.preview(args.diff)
        stop_on_interrupt(args.stack, args.cwd)
        return update.up(args.diff, args.yes, args.message)
    except (StackError, auto.CommandError) as error:
        print(f"kimipd {args.command}: {str(error).strip()[-2000:]}", file=sys.stderr)
        hint = engine_error_hint(str(error))
        if hint is not None:
            print(f"kimipd {args.command}: {hint}", file=sys.stderr)
        return DOWN
