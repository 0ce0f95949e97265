"""Ports: every process binds on the node's own network, so one port, one process."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


@dataclass(frozen=True)
class PortBinding:
    node: str
    port: int
    key: str  # the stack key that sets it
    group: str | None = None
    offset: int = 0  # dist-init: the key holds port - offset


def ports_do_not_collide(cfg: ClusterConfig) -> Iterable[str]:
    """One port, one process, per node."""
    bound: dict[tuple[str, int], PortBinding] = {}
    reported: set[tuple[str, str]] = set()
    problems = []
    fix = ("every container uses the node's own network (host networking), so one port, one "
           "process: choose another port.")
    for binding in cfg.port_bindings():
        other = bound.setdefault((binding.node, binding.port), binding)
        if other.key == binding.key or (binding.key, other.key) in reported:
            continue
        # Two groups' ranks on one node are refused as such (gpus_per_node,
        # groups_share_no_node_per_mode): the fix is another node, not another port.
        if binding.group is not None and other.group is not None and binding.group != other.group:
            continue
        reported.add((binding.key, other.key))
        used = f"is already used by {other.key}; {fix}"
        if binding.offset:
            written = binding.port - binding.offset
            problems.append(f"{binding.key}: {written} makes rank 0 bind {written}-{written + 7} "
                            f"on {binding.node}, and {binding.port} {used}")
        else:
            problems.append(f"{binding.key}: {binding.port} on {binding.node} {used}")
    return problems
