"""`scripts/kimipd targets`: the prometheusTargets output as a file_sd file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from components.outputs import OutputsError, read_outputs

from . import DEGRADED, DOWN, OK
from .pulumi_workspace import StackReader
from .stack import StackError


def run_targets(args: argparse.Namespace) -> int:
    """No SSH and no config: only the stack's outputs."""
    try:
        outputs = read_outputs(json.loads(Path(args.outputs_json).read_text())
                               if args.outputs_json
                               else StackReader(args.stack, args.cwd).outputs())
    except (StackError, OutputsError) as error:
        print(f"kimipd: {error}", file=sys.stderr)
        return DOWN
    targets = outputs.prometheus_targets or []
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(targets, indent=2) + "\n")
    partial.replace(args.out)
    print(f"{args.out}: {sum(len(entry['targets']) for entry in targets)} targets")
    if not targets:
        print("kimipd targets: the stack lists none; set kimipd:metrics.enabled true and "
              "`pulumi up`", file=sys.stderr)
        return DEGRADED
    return OK
