"""`scripts/kimipd verify`: the runbook's requests (ops/verify.py), with a live line while they
run."""

from __future__ import annotations

import argparse
import json

from . import status as status_command
from . import verify as verify_command
from .remote import Transport
from .stack import Stack
from .terminal import console, progress_line


def run_verify(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    with progress_line(args) as progress:
        report = verify_command.run(stack.topology, stack.verification, transport,
                                    timeout=args.timeout, via=args.via, seed=args.seed,
                                    only=args.only, api_key=stack.router_api_key,
                                    tls=status_command.door_tls(stack), on_progress=progress)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        console().print(verify_command.render(report))
    return report.exit_code
