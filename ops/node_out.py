"""`kimipd up` / `kimipd preview`: `pulumi up` / `pulumi preview` that never dial a node taken
out (`nodes[].out`). The program declares nothing on such a node; what the state still holds of
it would be deleted by the engine through its node (a remote command's delete dials 11 times,
15 s each; a container's needs its docker engine). So the update runs with those resources
excluded (`--exclude`: kept in the state, untouched), and once it has converged they are dropped
from the state (`pulumi state delete`), which contacts nothing. The groups that leave with the
node are deleted by the update itself: drained out of every router slot on the router's node
first, their ranks on other nodes stopped (docs/decisions.md, "Taking a node out")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stack import StackError

COMPONENT_TYPES_PREFIX = "kimipd:"
DOCKER_PROVIDER = "pulumi:providers:docker"


@dataclass(frozen=True)
class StateResource:
    urn: str
    type: str
    parent: str | None
    provider: str | None
    host: str | None  # a remote command's connection host
    docker_host: str | None  # a docker provider's ssh:// host

    @classmethod
    def from_export(cls, entry: Mapping[str, Any]) -> StateResource:
        inputs = entry.get("inputs") or {}
        connection = inputs.get("connection")
        host = connection.get("host") if isinstance(connection, Mapping) else None
        docker_host = inputs.get("host") if entry.get("type") == DOCKER_PROVIDER else None
        provider = entry.get("provider")
        return cls(urn=entry["urn"], type=entry.get("type", ""), parent=entry.get("parent"),
                   provider=provider.rsplit("::", 1)[0] if provider else None,
                   host=host if isinstance(host, str) else None,
                   docker_host=docker_host if isinstance(docker_host, str) else None)


def state_resources(export: Mapping[str, Any]) -> list[StateResource]:
    deployment = export.get("deployment") or {}
    return [StateResource.from_export(entry) for entry in deployment.get("resources") or []]


def _docker_host_address(value: str) -> str | None:
    """ssh://root@10.0.0.8:22 -> 10.0.0.8."""
    if not value.startswith("ssh://"):
        return None
    return value[len("ssh://"):].rsplit("@", 1)[-1].rsplit(":", 1)[0]


def resources_on(resources: Iterable[StateResource], addresses: Iterable[str],
                 deleted: Iterable[str] = ()) -> list[str]:
    """The URNs an update must not touch for the nodes at ADDRESSES: every remote command that
    connects to one, its docker provider and everything that provider serves, and the components
    above them that the update deletes (DELETED: the preview's delete steps), so no resource is
    left in the state without its parent. In state order (parents before children)."""
    wanted = set(addresses)
    resources = list(resources)
    providers = {r.urn for r in resources
                 if r.docker_host is not None and _docker_host_address(r.docker_host) in wanted}
    on_node = {r.urn for r in resources
               if r.host in wanted or r.urn in providers or r.provider in providers}
    by_urn = {r.urn: r for r in resources}
    going = set(deleted)
    for urn in list(on_node):
        parent = by_urn[urn].parent
        while parent and parent in by_urn and parent in going and parent not in on_node:
            on_node.add(parent)
            parent = by_urn[parent].parent
    return [r.urn for r in resources if r.urn in on_node]


def out_addresses(config: Mapping[str, Any]) -> list[str]:
    """The nodes the stack's config takes out (`pulumi config --json` values, parsed)."""
    entry = config.get("kimipd:nodes") or {}
    value = entry.get("objectValue")
    if value is None and isinstance(entry.get("value"), str):
        value = json.loads(entry["value"])
    return [node["address"] for node in value or []
            if isinstance(node, Mapping) and node.get("out") in (True, "true")]


def preview_deletes(steps: Iterable[Mapping[str, Any]]) -> set[str]:
    return {step["urn"] for step in steps if step.get("op") in ("delete", "delete-replaced")}


class OutUpdate:
    """One stack's update with its out nodes' resources excluded, then dropped."""

    def __init__(self, stack: str | None, cwd: Path) -> None:
        binary = shutil.which("pulumi")
        if binary is None:
            raise StackError("the pulumi CLI is not on PATH: source the env file "
                             "scripts/install-pulumi writes (~/.cache/kimipd/pulumi/env)")
        self.binary, self.stack, self.cwd = binary, stack, cwd

    def _argv(self, *args: str) -> list[str]:
        return [self.binary, *args, *(["-s", self.stack] if self.stack else [])]

    def _capture(self, *args: str) -> str:
        result = subprocess.run(self._argv(*args), cwd=self.cwd, capture_output=True, text=True,
                                check=False, stdin=subprocess.DEVNULL,
                                env=os.environ | {"PULUMI_SKIP_UPDATE_CHECK": "1"})
        if result.returncode != 0:
            raise StackError(f"`pulumi {' '.join(args[:2])}` failed: "
                             + (result.stderr.strip() or result.stdout.strip())[-3000:])
        return result.stdout

    def excluded(self) -> tuple[list[str], list[str]]:
        """(out node addresses, the URNs of the state's resources on them)."""
        addresses = out_addresses(json.loads(self._capture("config", "--json") or "{}"))
        if not addresses:
            return [], []
        resources = state_resources(json.loads(self._capture("stack", "export") or "{}"))
        if not resources_on(resources, addresses):
            return addresses, []
        # Dry run: no provider is called, no node dialled; it says which components go.
        preview = json.loads(self._capture("preview", "--json", "--suppress-progress") or "{}")
        return addresses, resources_on(resources, addresses,
                                       preview_deletes(preview.get("steps") or []))

    def run(self, operation: str, extra: list[str]) -> int:
        addresses, urns = self.excluded()
        if urns:
            print(f"kimipd {operation}: {', '.join(addresses)} out: {len(urns)} resources there "
                  f"are left out of this {operation} and not contacted"
                  + ("; dropped from the state once it converges" if operation == "up" else ""),
                  file=sys.stderr)
        elif addresses:
            print(f"kimipd {operation}: {', '.join(addresses)} out; the state holds nothing of "
                  "them", file=sys.stderr)
        argv = self._argv(operation, *extra, *[arg for urn in urns for arg in ("--exclude", urn)])
        code = subprocess.run(argv, cwd=self.cwd, check=False).returncode
        if code != 0 or operation != "up" or not urns:
            return code
        # Children before parents: a parent with a child still in the state is refused.
        self._capture("state", "delete", *reversed(urns), "--yes", "--force")
        print(f"kimipd up: {len(urns)} resources of {', '.join(addresses)} dropped from the "
              "state, none contacted", file=sys.stderr)
        return 0
