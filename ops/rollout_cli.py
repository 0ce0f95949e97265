"""`scripts/kimipd rollout`: the rollout's record on router.node (its phase, each slot's
contract, the leases); `kimipd rollout stop`: every node script of an update running now stops
waiting, so that update ends within seconds (what `kimipd up`'s Ctrl-C does)."""

from __future__ import annotations

import argparse
import json
import sys

from . import DEGRADED, DOWN, OK
from .remote import RemoteError, Transport
from .rollout import read, stop
from .stack import Stack


def run_rollout(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    door = stack.topology.door
    if door is None or door.state_dir is None:
        print("kimipd rollout: the stack has no rollout record (it has no door with the rust "
              "router)", file=sys.stderr)
        return DEGRADED
    if args.action == "stop":
        try:
            print(stop(transport, door, args.timeout))
        except RemoteError as error:
            print(f"kimipd rollout stop: {error}", file=sys.stderr)
            return DOWN
        return OK
    record = read(transport, door, args.timeout)
    if isinstance(record, str) or record is None:
        print(f"kimipd rollout: {record}", file=sys.stderr)
        return DOWN
    print(json.dumps(record.as_json(), indent=1) if args.json else record.describe())
    if record.under_way:
        print("a change of contract is under way: `scripts/kimipd up` takes it forward, or back "
              "with the old config (docs/router.md, \"The rollout's record\")",
              file=sys.stderr)
        return DEGRADED
    return OK
