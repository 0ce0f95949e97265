"""`scripts/kimipd status`: collect (ops/status.py), what reconcile remembers on this host, and
the table (ops/status_render.py) or JSON, once or --watch."""

from __future__ import annotations

import argparse
import json
import time

from rich.live import Live

from . import DOWN, status_render, verdict
from . import status as status_command
from .heal_policy import Memory
from .probe import Prober
from .reconcile import default_state_file, load_memory
from .remote import Transport
from .stack import Stack, StackError
from .terminal import console


def reconcile_memory(stack: str) -> Memory | None:
    """What reconcile remembers of STACK (its state file), if it runs on this host: when it
    first found each node lost, and its last failed heal."""
    path = default_state_file(stack)
    if not path.exists():
        return None
    try:
        return load_memory(path)
    except StackError:
        return None


def run_status(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    prober = Prober(transport, args.timeout, args.via, tls=status_command.door_tls(stack))
    out = console()

    def once() -> verdict.Report:
        forget = getattr(transport, "forget_failures", None)
        if forget is not None:
            forget()
        report = status_command.collect(stack.topology, transport, prober, args.timeout,
                                        args.generate_timeout, stack.router_api_key,
                                        stack.router_kind)
        memory = reconcile_memory(stack.topology.stack)
        if report.lost and memory is not None:
            verdict.note_lost_since(report, memory.lost_since)
        if report.hung and memory is not None:
            verdict.note_hung_since(report, {unit: state.broken_since
                                                    for unit, state in memory.units.items()})
        if memory is not None and memory.last_failure:
            report.notes.append(f"reconcile: the last heal failed: {memory.last_failure} "
                                "(its log line has the error lines; scripts/kimipd logs)")
        return report

    if not args.watch:
        report = once()
        prober.close()
        if args.json:
            print(json.dumps(report.as_json(), indent=2))
        else:
            out.print(status_render.render(report))
        return report.exit_code
    code = DOWN
    try:
        if args.json:
            while True:
                report = once()
                print(json.dumps(report.as_json()), flush=True)
                code = report.exit_code
                time.sleep(args.interval)
        with Live(console=out, auto_refresh=False) as live:
            while True:
                report = once()
                live.update(status_render.render(report), refresh=True)
                code = report.exit_code
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return code
