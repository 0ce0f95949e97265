"""The rollout's one record on the router's node (stdlib only, python3 >= 3.8): which contract
each group runs, which contract each router slot serves and whether it is out at the door to
take another, the leases of a rollout, and an operator's stop. Every actor reads it and writes
it under the state directory's lock: the Pulumi steps (router-members.py, door-slots.py), a
slot's restore, `kimipd reconcile` (through the restore) and `kimipd status` (read only).

It is one JSON file, `rollout.json`, replaced whole on each write, so a reader never sees half
of a step. Its phase (docs/router.md, "The rollout's record", has the transition table):

  steady      one contract among the groups, no lease held, no slot out for a contract
  replacing   one contract; a group (or a slot) is out for its replacement (a lease is held)
  converting  a slot is out at the door, emptied of one contract, taking the target's groups
  split       two contracts among the groups, each slot serving whole pairs of one of them

A group admitted before contracts were recorded runs the contract UNRECORDED: compatible with
no recorded one, so the first change of contract after an upgrade is kept apart like any other.
"""

from __future__ import annotations

import json
import os
import time

RECORD = "rollout.json"
VERSION = 1
PHASES = ("steady", "replacing", "converting", "split")
# What a group admitted before contracts existed (or never admitted here) runs, as far as this
# record knows: never paired with a recorded contract.
UNRECORDED = "unrecorded"


def empty() -> dict:
    return {"version": VERSION, "phase": "steady", "target": None, "groups": {}, "slots": {},
            "leases": {}, "stop": None, "step": "", "updated": 0.0}


def phase_of(record: dict, desired: list[str]) -> str:
    """The record's phase for the groups that should serve (DESIRED)."""
    if any(slot.get("converting") for slot in record["slots"].values()):
        return "converting"
    if len({record["groups"].get(group, UNRECORDED) for group in desired}) > 1:
        return "split"
    if record["leases"]:
        return "replacing"
    return "steady"


def legacy(directory: str) -> dict:
    """The record made from the files an earlier version kept (lease-MODE, converting-SLOT,
    contract/GROUP), for a router node that a rollout of this version has not written yet."""
    record = empty()
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith("lease-"):
            fields = _read(path).split()
            if len(fields) == 2:
                record["leases"][name[len("lease-"):]] = [fields[0], float(fields[1])]
        elif name.startswith("converting-"):
            record["slots"][name[len("converting-"):]] = {"contract": _read(path).strip(),
                                                          "converting": True}
    folder = os.path.join(directory, "contract")
    if os.path.isdir(folder):
        names = sorted(os.listdir(folder),
                       key=lambda name: os.stat(os.path.join(folder, name)).st_mtime_ns)
        for name in names:
            record["groups"][name] = _read(os.path.join(folder, name)).strip() or UNRECORDED
        if names:
            record["target"] = record["groups"][names[-1]]
    return record


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as stream:
        return stream.read()


def load(directory: str) -> dict:
    """The record (or the one an earlier version's files make, or an empty one)."""
    try:
        record = json.loads(_read(os.path.join(directory, RECORD)))
    except FileNotFoundError:
        return legacy(directory)
    if not isinstance(record, dict) or record.get("version") != VERSION:
        raise SystemExit(f"{os.path.join(directory, RECORD)}: not a rollout record of version "
                         f"{VERSION}; a newer kimipd wrote it: run this stack with that version")
    return {**empty(), **record}


def save(directory: str, record: dict, step: str, desired: list[str]) -> None:
    """Written whole (a new file renamed over the old), with its phase and the step that
    wrote it; the files an earlier version kept are gone once it is."""
    record["phase"] = phase_of(record, desired)
    record["step"] = step
    record["updated"] = time.time()
    path = os.path.join(directory, RECORD)
    with open(path + ".new", "w", encoding="utf-8") as stream:
        json.dump(record, stream, indent=1, sort_keys=True)
        stream.write("\n")
    os.replace(path + ".new", path)
    for name in os.listdir(directory):
        if name.startswith(("lease-", "converting-")):
            os.remove(os.path.join(directory, name))
    folder = os.path.join(directory, "contract")
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
