"""Reading an exported stack state for the docker resources on a node: which provider serves
which node, and the URNs of named containers (node_out's exclusions, reconcile's replacements)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DOCKER_PROVIDER = "pulumi:providers:docker"
CONTAINER = "docker:index/container:Container"


def docker_host_address(value: str) -> str | None:
    """ssh://root@10.0.0.8:22 -> 10.0.0.8."""
    if not value.startswith("ssh://"):
        return None
    return value[len("ssh://"):].rsplit("@", 1)[-1].rsplit(":", 1)[0]


def container_urns(export: Mapping[str, Any],
                   containers: Iterable[tuple[str, str]]) -> list[str]:
    """The URNs of the docker containers named CONTAINERS ((node, container name) pairs) in an
    exported state: what `up --replace` takes to replace exactly those (a hung unit's heal)."""
    wanted = set(containers)
    entries = (export.get("deployment") or {}).get("resources") or []
    hosts = {}
    for entry in entries:
        if entry.get("type") == DOCKER_PROVIDER:
            host = (entry.get("inputs") or {}).get("host")
            if isinstance(host, str):
                hosts[entry["urn"]] = docker_host_address(host)
    found = []
    for entry in entries:
        if entry.get("type") != CONTAINER:
            continue
        provider = (entry.get("provider") or "").rsplit("::", 1)[0]
        name = (entry.get("outputs") or {}).get("name") or (entry.get("inputs") or {}).get("name")
        if (hosts.get(provider), name) in wanted:
            found.append(entry["urn"])
    return found
