"""The Markdown a reviewer reads in the pull request."""

from __future__ import annotations

import ipaddress
from typing import Any

from .changes import (
    CLUSTER, Change, InputChange, ServingShape, changes, contract_changes, order, serving_shape,
    stack_name)

VERBS = {"create": "create", "replace": "replace", "update": "update in place", "delete": "delete"}
SUMMARY_ORDER = ("create", "replace", "update", "delete", "same")
SUMMARY_WORDS = {"create": "to create", "replace": "to replace", "update": "to update",
                 "delete": "to delete", "same": "unchanged"}


def _code(value: str | None) -> str:
    if value is None:
        return "(unset)"
    if value == "":
        return "(set, no value)"
    text = value if len(value) <= 120 else value[:117] + "..."
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _node_key(node: str) -> tuple:
    try:
        return (0, ipaddress.ip_address(node))
    except ValueError:
        return (1, node)


def _what(change: Change) -> str:
    kind = change.type.split(":")[-1]
    kind = KINDS.get(kind, kind)
    if change.container:
        return f"container `{change.container}`"
    return f"{kind} `{change.name}`"


def _input(change: InputChange) -> str:
    """`name` old -> new for a short plain value; the name alone for lists and long values."""
    plain = all(v is not None and len(v) <= 120 and not v.startswith(("[", "{"))
                for v in (change.old, change.new))
    if not plain:
        return f"`{change.name}`"
    return f"`{change.name}` {_code(change.old)} -> {_code(change.new)}"


KINDS = {"Container": "container", "RemoteImage": "image", "Command": "command",
         "CopyToRemote": "file copy"}


def _label(change: InputChange) -> str:
    return {"flag": "flag", "env": "env", "label": "label", "input": "input"}[change.kind] + \
        f" `{change.name}`"


def summary_line(preview: dict[str, Any]) -> str:
    counts = preview.get("changeSummary") or {}
    parts = [f"{counts[op]} {SUMMARY_WORDS[op]}" for op in SUMMARY_ORDER if counts.get(op)]
    parts += [f"{n} {op}" for op, n in sorted(counts.items()) if op not in SUMMARY_ORDER and n]
    return ", ".join(parts) or "no changes"


def _contract_section(found: list[Change], shape: ServingShape) -> list[str]:
    """What a reviewer must know first: a change to what prefill and decode must agree on, and
    how the rollout keeps the two apart (halves, or an outage)."""
    changed = contract_changes(found)
    if not changed:
        return []
    lines = ["#### The KV contract changes", "",
             "Prefill and decode must agree on these (docs/decisions.md, the KV contract):", ""]
    for item in changed:
        lines.append(f"- {_label(item.what)}: {_code(item.what.old)} -> {_code(item.what.new)} "
                     f"on {', '.join(f'`{group}`' for group in item.groups)}")
    modes = {mode for item in changed for mode in item.modes}
    lines.append("")
    counts = ", ".join(f"{len(shape.groups.get(mode, ()))} {mode}"
                       for mode in ("prefill", "decode"))
    if modes >= {"prefill", "decode"} and shape.in_halves:
        lines.append(f"**It rolls in halves and never pairs the two contracts** ({counts} "
                     "groups behind the door): one router slot leaves the door and takes the "
                     "first new prefill group, then its decode group, and comes back once both "
                     "serve; the other slot then moves to the new contract, and the other groups "
                     "follow. Half the groups of each mode serve during the roll "
                     "(docs/router.md).")
    elif modes >= {"prefill", "decode"} and shape.mini_lb:
        lines.append("**MiniLB does not keep the two contracts apart:** its worker list is fixed "
                     "and nothing admits a group, so while it rolls it may pair a prefill group "
                     "of one contract with a decode group of the other, and those answers are "
                     "wrong with status 200. Take the stack out of service first "
                     "(`serving: false`), or run the rust router (`router.kind: rust`).")
    elif modes >= {"prefill", "decode"}:
        why = ("one group of a mode" if shape.door
               else "one router: no door to keep a slot of each contract")
        lines.append(f"**It is an outage** ({counts} groups; {why}): no router holds the two "
                     "contracts at once, so the old groups leave it when the first new one is "
                     "admitted, and nothing serves until a new prefill and decode group both "
                     "do. Roll it in a maintenance window (docs/router.md).")
    else:
        lines.append(f"Only the {', '.join(sorted(modes))} groups change, and the preview "
                     "checked that both modes still agree (a decode context length may exceed "
                     "prefill's): it rolls as any change, one group at a time.")
    lines.append("")
    return lines


def render(preview: dict[str, Any]) -> str:
    found = changes(preview)
    lines = [f"### `pulumi preview` of stack `{stack_name(preview)}`: {summary_line(preview)}", ""]
    if not found:
        lines.append("Nothing changes: every resource is as deployed.")
        return "\n".join(lines) + "\n"

    lines += _contract_section(found, serving_shape(preview))
    lines += ["| node | role | resource | change |", "| --- | --- | --- | --- |"]
    for change in sorted(found, key=lambda c: (_node_key(c.node), c.role, not c.is_container,
                                               c.name)):
        lines.append(f"| {change.node} | {change.role} | {_what(change)} | {VERBS[change.op]} |")

    containers = [c for c in found if c.is_container and c.op in ("replace", "update")]
    lines.append("")
    if containers:
        lines += ["#### What changes in each container", ""]
        for change in sorted(containers, key=lambda c: (_node_key(c.node), c.role)):
            lines.append(f"**{change.role}** on {change.node} (`{change.container}`), "
                         f"{VERBS[change.op]}:")
            lines.append("")
            if change.inputs:
                lines += ["| what | old | new |", "| --- | --- | --- |"]
                lines += [f"| {_label(i)} | {_code(i.old)} | {_code(i.new)} |"
                          for i in change.inputs]
            else:
                lines.append("no input of its own differs: replaced because something it depends "
                             "on is replaced")
            lines.append("")

    others = [c for c in found if not c.is_container and c.op in ("replace", "update") and c.inputs]
    if others:
        lines += ["#### Other resources: inputs that change", ""]
        for change in sorted(others, key=lambda c: (_node_key(c.node), c.name)):
            where = f" on {change.node}" if change.node != CLUSTER else ""
            lines.append(f"- {_what(change)}{where}: "
                         + ", ".join(_input(i) for i in change.inputs))
        lines.append("")

    lines += ["#### Order", ""]
    lines.append("The engine runs these in waves; each waits for the one before it "
                 "(dependencies; deletions run dependents first).")
    lines.append("")
    for number, wave in enumerate(order(found), start=1):
        # A container by its role (decode-r0): its resource is named by node and mode.
        items = ", ".join(f"{VERBS[c.op]} {c.role if c.is_container else c.name}"
                          + (f" ({c.node})" if c.node != CLUSTER else "")
                          for c in sorted(wave, key=lambda c: (_node_key(c.node), c.name)))
        lines.append(f"{number}. {items}")
    return "\n".join(lines) + "\n"
