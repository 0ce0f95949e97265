"""`scripts/kimipd logs`: the bundle (ops/logs.py) and what it holds, in a few lines."""

from __future__ import annotations

import argparse
import json
import sys

from . import DEGRADED
from . import logs as logs_command
from .remote import Transport
from .stack import Stack
from .terminal import progress_line


def run_logs(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    try:
        with progress_line(args) as progress:
            path, index, code = logs_command.collect_bundle(
                stack.topology, transport, args.out, since=args.since, selectors=args.role,
                timeout=args.timeout, on_progress=progress)
    except ValueError as error:
        print(f"kimipd logs: {error}", file=sys.stderr)
        return DEGRADED
    if args.json:
        print(json.dumps(index | {"bundle": str(path)}, indent=2))
        return code
    files = index["files"]
    size = path.stat().st_size
    print(f"bundle: {path} ({len(index['containers'])} containers on {len(index['nodes'])} "
          f"nodes, {sum(1 for f in files if f['status'] != 'absent')} files, "
          f"{size / 1e6:.2f} MB, {index['seconds']}s)")
    # One line per tool and outcome, not per node: eight nodes without ibstat is one fact.
    noted: dict[str, list[str]] = {}
    for entry in files:
        if entry["status"] == "absent":
            noted.setdefault(f"absent: {entry['what']}", []).append(entry["node"])
        elif entry["status"] == "nonzero":
            noted.setdefault(f"exit {entry['exit_status']}: {entry['what']} ({entry['error']}; "
                             "output kept)", []).append(entry["node"])
    for what, nodes in noted.items():
        print(f"{what} on {', '.join(nodes)}")
    failed = [f for f in files if f["status"] == "failed"]
    for entry in failed:
        print(f"failed: {entry['path']} ({entry['what']}): {entry['error']}")
    print(f"{len(failed)} failed; exit {code}")
    return code
