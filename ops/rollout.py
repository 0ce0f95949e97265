"""The rollout's record on router.node (assets/rollout_state.py), as `kimipd status`,
`kimipd rollout` and reconcile read it, and an operator's stop of the node scripts that wait in
a running update (`kimipd rollout stop`, and `kimipd up`'s Ctrl-C)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from components.render import NODE_ASSET_DIR

from .remote import RemoteError, Transport, run_patiently
from .topology import Door

RECORD = "rollout.json"
# A change of contract under way: reconcile registers no group then (the rollout's own steps
# and the next `kimipd up` do; docs/router.md, "The rollout's record").
UNDER_WAY = ("converting", "split")


@dataclass(frozen=True)
class Rollout:
    phase: str
    target: str | None = None
    # slot -> {"contract": ..., "converting": bool}
    slots: dict[str, dict[str, Any]] = field(default_factory=dict)
    # mode (or "slot") -> the holder of its lease
    leases: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)
    step: str = ""

    @property
    def under_way(self) -> bool:
        return self.phase in UNDER_WAY

    def describe(self) -> str:
        """One line: the phase, each slot's contract, the leases."""
        parts = [f"phase {self.phase}"]
        for slot, entry in sorted(self.slots.items()):
            contract = str(entry.get("contract") or "?")[:12]
            doing = "out at the door, taking" if entry.get("converting") else "serves"
            parts.append(f"{slot} {doing} {contract}")
        parts += [f"{mode} lease held by {holder}" for mode, holder in sorted(self.leases.items())]
        if self.step:
            parts.append(f"last step: {self.step}")
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "target": self.target, "slots": self.slots,
                "leases": self.leases, "groups": self.groups, "step": self.step}


def parse(text: str) -> Rollout:
    """The record's text; an empty one (no rollout has written it yet): steady."""
    if not text.strip():
        return Rollout("steady")
    record = json.loads(text)
    return Rollout(phase=str(record.get("phase") or "steady"), target=record.get("target"),
                   slots=dict(record.get("slots") or {}),
                   leases={mode: str(held[0]) for mode, held in
                           (record.get("leases") or {}).items() if held},
                   groups=dict(record.get("groups") or {}), step=str(record.get("step") or ""))


def read(transport: Transport, door: Door, timeout: float) -> Rollout | str | None:
    """The record on router.node; None without one (no rust router); why, when it cannot be
    read."""
    if door.state_dir is None:
        return None
    path = f"{door.state_dir}/{RECORD}"
    try:
        result = run_patiently(transport, door.node,
                               f"cat {shlex.quote(path)} 2>/dev/null || true", timeout)
    except RemoteError as error:
        return f"the rollout's record on {door.node} cannot be read: {error}"
    if result.status != 0:
        return f"the rollout's record on {door.node} cannot be read: {result.failure}"
    try:
        return parse(result.out)
    except (ValueError, TypeError, IndexError) as error:
        return f"{path} on {door.node} is not a rollout record: {error}"


def stop(transport: Transport, door: Door, timeout: float) -> str:
    """Asks every node script of an update running now to stop waiting (they fail at once, so
    the engine ends the update); what the nodes said. On router.node (the memberships, slot
    a's door) and on the other door node, whose door-slots.py waits (its door's drain of a
    slot) read the record there."""
    if door.state_dir is None:
        raise RemoteError("the stack has no rollout record (MiniLB, or no door)")
    command = (f"python3 {NODE_ASSET_DIR}/router-members.py stop "
               f"--state-dir {shlex.quote(door.state_dir)}")
    result = transport.run(door.node, command, timeout)
    if result.status != 0:
        raise RemoteError(f"{door.node}: {result.failure}")
    others = [node.address for node in door.nodes if node.address != door.node]
    if not others:
        return result.out.strip()
    said = [f"{door.node}: {result.out.strip()}"]
    unasked = "{node}: not asked ({why}); its door's waits end with their bound"
    for node in others:
        try:
            other = transport.run(node, command, timeout)
        except RemoteError as error:
            said.append(unasked.format(node=node, why=error))
            continue
        said.append(f"{node}: {other.out.strip()}" if other.status == 0 else
                    unasked.format(node=node, why=other.failure))
    return "\n".join(said)
