"""`scripts/kimipd orphans`: the containers on the nodes that the state does not know
(ops/orphans.py), judged by the roles the config defines, and --remove."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import DEGRADED, DOWN, OK
from . import orphans as orphans_command
from .pulumi_workspace import StackReader
from .remote import Transport
from .stack import Stack, StackError
from .terminal import console


def run_orphans(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    try:
        export = (json.loads(Path(args.state_json).read_text()) if args.state_json
                  else StackReader(args.stack, args.cwd).export())
    except (StackError, OSError, json.JSONDecodeError) as error:
        print(f"kimipd: the stack's state cannot be read: {error}", file=sys.stderr)
        return DOWN
    if stack.roles_problem is not None:
        # Which containers are this stack's is the config's to say (another stack's may share
        # the nodes): with a config the program would refuse, none is judged, none removed.
        print("kimipd: orphans judges containers by the roles the stack's config defines, and "
              f"the config does not validate; fix it first: {stack.roles_problem}",
              file=sys.stderr)
        return DOWN
    known = orphans_command.known_container_ids(export)
    # The config's nodes too: a killed first `up` leaves no outputs to name them.
    nodes = sorted({*stack.access.nodes, *stack.topology.nodes})
    scanned = orphans_command.scan(nodes, transport, args.timeout)
    findings = orphans_command.find_orphans(scanned.containers, known, stack.roles)
    failures = (orphans_command.remove(findings, transport, args.timeout)
                if args.remove and findings else {})
    if args.json:
        print(json.dumps(orphans_command.as_json(findings, scanned, args.remove, failures),
                         indent=2))
    else:
        if findings:
            console().print(orphans_command.render(findings, scanned, stack.topology.stack))
        else:
            print(f"stack {stack.topology.stack}: no orphans among "
                  f"{len(scanned.containers)} kimipd container(s) on {len(nodes)} node(s)")
        for node, error in {**scanned.unreachable, **failures}.items():
            print(f"{node}: {error}", file=sys.stderr)
        if findings and args.remove and not failures:
            print(f"removed {len(findings)} container(s); {orphans_command.NEXT_STEPS}")
        elif findings and not args.remove:
            print(f"kimipd orphans --remove removes them; {orphans_command.NEXT_STEPS}")
    if scanned.unreachable or failures or (findings and not args.remove):
        return DEGRADED
    return OK
