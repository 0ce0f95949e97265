"""The preview's steps as changes a reviewer reads: which node, which role, what differs.

Pure functions over the JSON `pulumi preview --json` prints; no Pulumi import. A node is found,
in order, in the deployed stack's own `containers` output (the contract for downstream tooling),
then in the program's resource names (`node-10-231-60-5-image`, the docker provider
`node-10-231-60-5-docker`, `decode-r0-health` belonging to role `decode-r0`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from components.outputs import ContainerOutput

CONTAINER = "docker:index/container:Container"
# What the engine shows for a value it will only know after apply.
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
CLUSTER = "(cluster)"
_NODE_NAME = re.compile(r"^node-(\d+)-(\d+)-(\d+)-(\d+)(?:-|$)")


@dataclass(frozen=True)
class InputChange:
    """One changed input: a flag (`--max-running-requests`), an env var, a label, or another
    input of the resource (`image`, `triggers`); None = not set on that side."""

    kind: str  # flag | env | label | input
    name: str
    old: str | None
    new: str | None


@dataclass
class Change:
    op: str  # create | replace | update | delete
    urn: str
    type: str
    name: str
    node: str
    role: str
    container: str | None
    inputs: list[InputChange]
    dependencies: list[str] = field(default_factory=list)
    group: str = ""  # a rank's group (its kimipd.group label); "" for anything else
    mode: str = ""  # a rank's --disaggregation-mode

    @property
    def is_container(self) -> bool:
        return self.type == CONTAINER


def shown(value: Any) -> str | None:
    if value is None:
        return None
    if value == UNKNOWN:
        return "(known after apply)"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":")).replace(UNKNOWN, "?")


def argv_flags(argv: list[str]) -> dict[str, str]:
    """`--flag value` / `--flag=value` / `--switch` -> {flag: value}; a flag given more than once
    (the launch wrapper's `--wheel`) keeps every value, space-separated; a positional word is
    keyed by its position among the positionals (`argv[0]`)."""
    flags: dict[str, list[str]] = {}
    positional = 0
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            i += 1
            continue
        if token.startswith("-") and len(token) > 1:
            name, eq, value = token.partition("=")
            if not eq:
                following = argv[i + 1] if i + 1 < len(argv) else None
                if following is not None and not following.startswith("--"):
                    value, i = following, i + 1
                else:
                    value = ""
            flags.setdefault(name, []).append(value)
        else:
            flags.setdefault(f"argv[{positional}]", []).append(token)
            positional += 1
        i += 1
    return {name: " ".join(values) for name, values in flags.items()}


def _diff(kind: str, old: dict[str, str], new: dict[str, str]) -> list[InputChange]:
    return [InputChange(kind, name, old.get(name), new.get(name))
            for name in sorted(old.keys() | new.keys(), key=_flag_order(old, new))
            if old.get(name) != new.get(name)]


def _flag_order(old: dict[str, str], new: dict[str, str]):
    order = {name: i for i, name in enumerate([*new, *(n for n in old if n not in new)])}
    return lambda name: order[name]


def _envs(value: Any) -> dict[str, str]:
    return dict(item.split("=", 1) for item in value or [] if isinstance(item, str) and "=" in item)


# Rank 0's container id on ranks >= 1: it changes exactly when rank 0 is replaced, which the
# review already lists, so it is not shown as a change of its own.
FOLLOWS_RANK0 = "kimipd.rank0-container"


def _labels(value: Any) -> dict[str, str]:
    return {item["label"]: item["value"] for item in value or []
            if isinstance(item, dict) and item.get("label") != FOLLOWS_RANK0}


def input_changes(type_: str, old: dict[str, Any], new: dict[str, Any]) -> list[InputChange]:
    """What differs between two input sets; a container's command, envs and labels key by key."""
    old = {k: v for k, v in old.items() if k != "__defaults"}
    new = {k: v for k, v in new.items() if k != "__defaults"}
    changes: list[InputChange] = []
    keys = sorted(old.keys() | new.keys())
    if type_ == CONTAINER:
        changes += _diff("flag", argv_flags(old.get("command") or []),
                         argv_flags(new.get("command") or []))
        changes += _diff("env", _envs(old.get("envs")), _envs(new.get("envs")))
        changes += _diff("label", _labels(old.get("labels")), _labels(new.get("labels")))
        keys = [k for k in keys if k not in ("command", "envs", "labels")]
    for key in keys:
        if old.get(key) != new.get(key):
            changes.append(InputChange("input", key, shown(old.get(key)), shown(new.get(key))))
    return changes


def _short(urn: str) -> str:
    return urn.split("::")[-1]


def _address(name: str) -> str | None:
    match = _NODE_NAME.match(name)
    return ".".join(match.groups()) if match else None


def stack_name(preview: dict[str, Any]) -> str:
    for step in preview.get("steps", []):
        return step["urn"].split(":")[2]  # urn:pulumi:STACK::PROJECT::...
    return "?"


def deployed_roles(preview: dict[str, Any]) -> dict[str, str]:
    """role -> node from the deployed stack's `containers` output (empty before the first up),
    each entry read by the outputs' model (components/outputs.py): its shape has not changed
    across the outputs' versions, so a stack a kimipd of another version deployed reads too."""
    for step in preview.get("steps", []):
        state = step.get("oldState") or {}
        if state.get("type") == "pulumi:pulumi:Stack":
            containers = (state.get("outputs") or {}).get("containers") or {}
            found = {}
            for role, entry in containers.items():
                try:
                    found[role] = ContainerOutput.model_validate(entry).node
                except ValidationError:
                    continue
            return found
    return {}


def changes(preview: dict[str, Any]) -> list[Change]:
    """Every custom resource the preview creates, replaces, updates or deletes, in step order."""
    found: list[Change] = []
    for step in preview.get("steps", []):
        op = step["op"]
        if op in ("same", "read", "refresh") or op.startswith("discard"):
            continue
        old = step.get("oldState") or {}
        new = step.get("newState") or {}
        state = new or old
        if not state.get("custom", False) or state.get("type", "").startswith("pulumi:providers:"):
            continue
        inputs = new.get("inputs") or {} if op != "delete" else {}
        before = old.get("inputs") or {} if op != "create" else {}
        labels = _labels((inputs or before).get("labels"))
        flags = argv_flags((inputs or before).get("command") or [])
        name = _short(step["urn"])
        found.append(Change(
            op={"create-replacement": "replace", "delete-replaced": "replace"}.get(op, op),
            urn=step["urn"], type=state.get("type", ""), name=name, node="",
            role=labels.get("kimipd.role", ""),
            container=(inputs or before).get("name") if state.get("type") == CONTAINER else None,
            inputs=(input_changes(state.get("type", ""), before, inputs)
                    if op in ("replace", "update") else []),
            dependencies=list(state.get("dependencies") or []),
            group=labels.get("kimipd.group", ""),
            mode=flags.get("--disaggregation-mode", "") if state.get("type") == CONTAINER else "",
        ))
    _place(found, deployed_roles(preview), preview)
    return found


def _place(found: list[Change], deployed: dict[str, str], preview: dict[str, Any]) -> None:
    """Fill in each change's node and role."""
    providers = {step["urn"]: step.get("provider", "") for step in preview.get("steps", [])}
    roles = dict(deployed)
    for change in found:
        if change.role and change.role not in roles:
            provider_name = _short(providers.get(change.urn, "").rsplit("::", 1)[0])
            address = _address(provider_name)
            if address:
                roles[change.role] = address
    for change in found:
        if not change.role:
            address = _address(change.name)
            if address:
                change.role, change.node = "node", address
                continue
            owner = max((role for role in roles if change.name.startswith(role + "-")),
                        key=len, default=None)
            change.role = owner or change.name
        change.node = roles.get(change.role) or change.node or CLUSTER


def order(found: list[Change]) -> list[list[Change]]:
    """The changes in the order the engine runs them: each wave waits for the one before it
    (dependency edges among the changed resources; deletes run dependents first)."""
    by_urn = {change.urn: change for change in found}
    level: dict[str, int] = {}

    def forward(change: Change, seen: frozenset[str] = frozenset()) -> int:
        if change.urn not in level:
            deps = [by_urn[d] for d in change.dependencies if d in by_urn and d not in seen
                    and by_urn[d].op != "delete"]
            level[change.urn] = 1 + max((forward(d, seen | {change.urn}) for d in deps), default=-1)
        return level[change.urn]

    dependents: dict[str, list[Change]] = {}
    for change in found:
        for dep in change.dependencies:
            dependents.setdefault(dep, []).append(change)

    def backward(change: Change, seen: frozenset[str] = frozenset()) -> int:
        if change.urn not in level:
            users = [d for d in dependents.get(change.urn, [])
                     if d.op == "delete" and d.urn not in seen]
            level[change.urn] = 1 + max((backward(d, seen | {change.urn}) for d in users),
                                        default=-1)
        return level[change.urn]

    deletes = [c for c in found if c.op == "delete"]
    others = [c for c in found if c.op != "delete"]
    waves: list[list[Change]] = []
    for group, rank in ((deletes, backward), (others, forward)):
        buckets: dict[int, list[Change]] = {}
        for change in group:
            buckets.setdefault(rank(change), []).append(change)
        waves += [buckets[i] for i in sorted(buckets)]
    return waves


def _contract_inputs() -> set[tuple[str, str]]:
    """(kind, name) of the inputs a prefill and a decode group must agree on: the KV contract's
    flags (components/config/rules/kv_contract.py), the model, the transfer backend, the image
    (SGLang's version and its transfer code)."""
    from components.config.rules.kv_contract import CONTEXT_LENGTH, CONTRACT_FLAGS

    flags = {"--" + dest.replace("_", "-") for dest in (*CONTRACT_FLAGS, CONTEXT_LENGTH)}
    flags |= {"--model-path", "--served-model-name", "--disaggregation-transfer-backend"}
    return {("flag", flag) for flag in flags} | {("input", "image")}


@dataclass(frozen=True)
class ContractChange:
    """One input of the KV contract that replaced rank 0s change, and the groups it does: the
    old and new values where every group has the same ones, else "(differs by node)" (a
    prepared image's id, built on each node)."""

    what: InputChange
    groups: tuple[str, ...]
    modes: tuple[str, ...]


def contract_changes(found: list[Change]) -> list[ContractChange]:
    """The KV contract's inputs that the preview changes on the groups' rank 0 containers (a
    group's ranks share its command), each with the groups and modes it changes on."""
    wanted = _contract_inputs()
    by_input: dict[tuple[str, str], list[tuple[Change, InputChange]]] = {}
    for change in found:
        if not (change.is_container and change.group and change.mode
                and change.op in ("replace", "update") and change.role.endswith("-r0")):
            continue
        for item in change.inputs:
            if (item.kind, item.name) in wanted:
                by_input.setdefault((item.kind, item.name), []).append((change, item))

    def one(values: set[str | None]) -> str | None:
        return values.pop() if len(values) == 1 else "(differs by node)"

    return [ContractChange(InputChange(kind, name, one({item.old for _, item in seen}),
                                       one({item.new for _, item in seen})),
                           tuple(sorted({change.group for change, _ in seen})),
                           tuple(sorted({change.mode for change, _ in seen})))
            for (kind, name), seen in by_input.items()]


@dataclass(frozen=True)
class ServingShape:
    """The groups of each mode the stack will have, and whether its clients come through the
    door (two router slots): how a change of the KV contract rolls."""

    groups: dict[str, tuple[str, ...]]
    door: bool
    # MiniLB (`--mini-lb`): its worker list is fixed and nothing admits a group, so nothing keeps
    # two contracts apart in it.
    mini_lb: bool = False

    @property
    def in_halves(self) -> bool:
        """Behind the door with two or more groups of each mode, a change of contract keeps
        serving: one slot takes the first new prefill and decode while the other serves the old
        ones (assets/router-members.py). Otherwise it is an outage."""
        return not self.mini_lb and self.door and all(len(self.groups.get(mode, ())) >= 2
                                                      for mode in ("prefill", "decode"))


def serving_shape(preview: dict[str, Any]) -> ServingShape:
    """The stack's groups and door after the preview's update (every container it keeps or
    makes: a step's new state, or its old one where it has none)."""
    groups: dict[str, set[str]] = {"prefill": set(), "decode": set()}
    slots: set[str] = set()
    mini_lb = False
    for step in preview.get("steps", []):
        if step["op"] in ("delete", "delete-replaced", "discard"):
            continue
        state = step.get("newState") or step.get("oldState") or {}
        if state.get("type") != CONTAINER:
            continue
        inputs = state.get("inputs") or {}
        labels = _labels(inputs.get("labels"))
        mode = argv_flags(inputs.get("command") or []).get("--disaggregation-mode", "")
        if labels.get("kimipd.group") and mode in groups:
            groups[mode].add(labels["kimipd.group"])
        role = labels.get("kimipd.role", "")
        if role.startswith("router-"):
            slots.add(role)
        if role.startswith("router") and "--mini-lb" in (inputs.get("command") or []):
            mini_lb = True
    return ServingShape({mode: tuple(sorted(names)) for mode, names in groups.items()},
                        len(slots) >= 2, mini_lb)
