"""A change of the serving contract, named where `kimipd preview` and `kimipd up` show the
preview: what prefill and decode must share changes (components/render/contract.py), and how
the rollout keeps the two apart (assets/router-members.py): in halves behind the door with two
or more groups of each mode, otherwise an outage. Pure: read from the preview's steps."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pulumi import automation as auto

MEMBERS_SCRIPT = "router-members.py"


@dataclass(frozen=True)
class ContractChange:
    old: str
    new: str
    groups: dict[str, int]  # mode -> how many groups it has after the update
    door: bool

    @property
    def in_halves(self) -> bool:
        return self.door and all(self.groups.get(mode, 0) >= 2 for mode in ("prefill", "decode"))

    def note(self) -> str:
        counts = ", ".join(f"{self.groups.get(mode, 0)} {mode}" for mode in ("prefill", "decode"))
        head = (f"kimipd: this update changes the serving contract ({self.old} -> {self.new}: "
                "what prefill and decode must share, docs/router.md)")
        if self.in_halves:
            return (f"{head}. It rolls in halves behind the door ({counts} groups): half the "
                    "groups of each mode serve at the fewest, and no answer pairs the two.")
        why = "one group of a mode" if self.door else "one router, no door"
        return (f"{head}. It is an OUTAGE ({counts} groups; {why}): no router holds the two "
                "at once, so nothing serves from the first group's drain until a new prefill "
                "and decode group both do. Roll it in a maintenance window.")


def _admission(inputs: Mapping[str, Any] | None) -> tuple[str, str, bool] | None:
    """(contract, mode, behind the door) of a group's admission command; None for any other
    (a command this does not parse as one, a script with a quote of its own among them)."""
    create = str((inputs or {}).get("create") or "")
    if MEMBERS_SCRIPT not in create:
        return None
    try:
        words = shlex.split(create)
    except ValueError:
        return None
    if not any(word.endswith(MEMBERS_SCRIPT) for word in words) or "admit" not in words:
        return None

    def after(flag: str) -> str:
        return words[words.index(flag) + 1] if flag in words[:-1] else ""

    return after("--contract"), after("--mode"), "--door-socket" in words


def contract_change(steps: Iterable[tuple[Mapping[str, Any] | None,
                                          Mapping[str, Any] | None]]) -> ContractChange | None:
    """From each step's (old inputs, new inputs): the change of contract the groups' admissions
    carry, with the shape they will have; None when the contract stays (or there is none)."""
    old_contracts, new_contracts = set(), set()
    groups: dict[str, int] = {}
    door = False
    for old, new in steps:
        before, after = _admission(old), _admission(new)
        if after is not None:
            new_contracts.add(after[0])
            groups[after[1]] = groups.get(after[1], 0) + 1
            door = door or after[2]
        if before is not None and before[0]:
            old_contracts.add(before[0])
    new_contracts.discard("")
    if len(new_contracts) != 1 or not old_contracts or old_contracts == new_contracts:
        return None
    return ContractChange(", ".join(sorted(old_contracts - new_contracts)) or "?",
                          next(iter(new_contracts)), groups, door)


class StepInputs:
    """An engine event handler that keeps each step's old and new inputs."""

    def __init__(self) -> None:
        self.steps: list[tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]] = []

    def __call__(self, event: auto.EngineEvent) -> None:
        pre = event.resource_pre_event
        if pre is None:
            return
        metadata = pre.metadata
        self.steps.append((metadata.old.inputs if metadata.old else None,
                           metadata.new.inputs if metadata.new else None))

    def change(self) -> ContractChange | None:
        return contract_change(self.steps)
