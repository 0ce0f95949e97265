"""`kimipd orphans`: kimipd containers on the nodes that the stack's state does not know.

A `pulumi` process killed mid-`up` (SIGKILL, a lost terminal, OOM) can leave containers it had
created but not yet recorded. Their names are fixed (`kimipd-<role>`), so the next `up` fails
with "name already in use". Removing the orphan alone is not enough for an SGLang group: a rank
the state knows, left running beside a new rank 0, waits for a group that no longer exists. So
every container of an orphan's group goes too, and `up` then starts the group whole.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from .remote import RemoteError, Transport

CONTAINER_TYPE = "docker:index/container:Container"
FIELDS = ("{{.ID}}", "{{.Names}}", '{{.Label "kimipd.role"}}', '{{.Label "kimipd.group"}}',
          "{{.State}}")
LIST_COMMAND = shlex.join(["docker", "ps", "-a", "--no-trunc", "--filter", "label=kimipd.role",
                           "--format", "\t".join(FIELDS)])
NEXT_STEPS = ("then: `pulumi cancel` if the stack is still locked, `pulumi refresh "
              "--clear-pending-creates`, `pulumi up`")


@dataclass(frozen=True)
class NodeContainer:
    node: str
    id: str
    name: str
    role: str
    group: str | None
    state: str


@dataclass(frozen=True)
class Finding:
    container: NodeContainer
    reason: str


def parse_listing(node: str, text: str) -> list[NodeContainer]:
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cid, name, role, group, state = (line.split("\t") + [""] * 5)[:5]
        found.append(NodeContainer(node=node, id=cid, name=name, role=role,
                                   group=group or None, state=state))
    return found


def known_container_ids(export: Mapping[str, Any]) -> set[str]:
    """Container ids `pulumi stack export` records, live or pending deletion."""
    deployment = export.get("deployment") or {}
    return {resource["id"] for resource in deployment.get("resources") or []
            if resource.get("type") == CONTAINER_TYPE and resource.get("id")}


def find_orphans(containers: Iterable[NodeContainer], known_ids: set[str],
                 roles: frozenset[str]) -> list[Finding]:
    """The containers to remove: each one the state does not know, and its whole group.

    Only roles this stack's config defines: another stack's containers on the same nodes (other
    group names) are not this state's to judge.
    """
    containers = [c for c in containers if c.role in roles]
    orphans = [c for c in containers if c.id not in known_ids]
    broken_groups = {c.group for c in orphans if c.group}
    findings = []
    for container in containers:
        if container.id not in known_ids:
            findings.append(Finding(container, "not in the stack's state"))
        elif container.group in broken_groups:
            findings.append(Finding(container, f"in the state, but group {container.group} "
                                               "has an orphan: a rank left alone would hang"))
    return findings


@dataclass
class Scan:
    containers: list[NodeContainer]
    unreachable: dict[str, str]


def scan(nodes: Iterable[str], transport: Transport, timeout: float) -> Scan:
    nodes = list(nodes)

    def listing(node: str) -> tuple[str, list[NodeContainer] | None, str]:
        try:
            result = transport.run(node, LIST_COMMAND, timeout)
        except RemoteError as error:
            return node, None, str(error)
        if result.status != 0:
            return node, None, f"`docker ps` exited {result.status}: {result.err.strip()[-300:]}"
        return node, parse_listing(node, result.out), ""

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes))),
                            thread_name_prefix="kimipd-orphans") as pool:
        answers = list(pool.map(listing, nodes))
    return Scan(containers=[c for _, found, _ in answers for c in found or []],
                unreachable={node: error for node, found, error in answers if found is None})


def remove(findings: Iterable[Finding], transport: Transport, timeout: float) -> dict[str, str]:
    """`docker rm -f` per node; returns the nodes where it failed, with the error."""
    by_node: dict[str, list[str]] = {}
    for finding in findings:
        by_node.setdefault(finding.container.node, []).append(finding.container.id)
    failed = {}
    for node, ids in by_node.items():
        try:
            result = transport.run(node, shlex.join(["docker", "rm", "-f", *ids]), timeout)
        except RemoteError as error:
            failed[node] = str(error)
            continue
        if result.status != 0:
            failed[node] = f"`docker rm -f` exited {result.status}: {result.err.strip()[-300:]}"
    return failed


def render(findings: list[Finding], scanned: Scan, stack: str) -> Table:
    table = Table(title=f"stack {stack}: {len(findings)} container(s) to remove, "
                        f"{len(scanned.containers)} kimipd container(s) on the nodes",
                  title_justify="left", show_edge=False, pad_edge=False)
    for column in ("node", "container", "group", "state", "id", "why"):
        table.add_column(column)
    for finding in findings:
        c = finding.container
        table.add_row(c.node, c.name, c.group or "-", c.state, c.id[:12], finding.reason)
    return table


def as_json(findings: list[Finding], scanned: Scan, removed: bool,
            remove_failures: Mapping[str, str]) -> dict[str, Any]:
    return {
        "orphans": [{"node": f.container.node, "container": f.container.name,
                     "id": f.container.id, "role": f.container.role, "group": f.container.group,
                     "state": f.container.state, "reason": f.reason} for f in findings],
        "scanned": len(scanned.containers),
        "unreachable": scanned.unreachable,
        "removed": removed and not remove_failures,
        "removeFailures": dict(remove_failures),
    }
