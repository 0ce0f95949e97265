"""Prometheus targets: what the stack output prometheusTargets lists."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import ClusterConfig
from .layout import MOONCAKE_MASTER, ROUTER, rank_role

# The door's HAProxy exporter; its slots' routers keep role `router`, told apart by `slot`.
DOOR = "door"


def door_targets(stack: str, node: str, metrics_port: int,
                 slot_metrics_ports: Mapping[str, int], rust: bool) -> list[dict[str, object]]:
    """The door's targets: HAProxy's own exporter (haproxy_server_status{proxy="slots"}, one
    series per slot and state, and haproxy_backend_active_servers), and each slot router's metrics
    port (SLOT -> PORT) when the slots are rust routers (MiniLB serves no metrics)."""
    targets: list[dict[str, object]] = [{
        "targets": [f"{node}:{metrics_port}"],
        "labels": {"stack": stack, "role": DOOR, "node": node},
    }]
    if rust:
        for slot, port in sorted(slot_metrics_ports.items()):
            targets.append({
                "targets": [f"{node}:{port}"],
                "labels": {"stack": stack, "role": ROUTER, "slot": slot, "node": node},
            })
    return targets


def prometheus_targets(cfg: ClusterConfig, stack: str) -> list[dict[str, object]]:
    """A Prometheus file_sd_configs document: every SGLang rank's /metrics (rank 0 on the API
    port, ranks >= 1 on their dummy health server, same port) and the Mooncake master's metrics
    port; then the rust router's metrics port (MiniLB serves none), or with a door, the door's
    exporter and each slot router's metrics port. Empty unless metrics.enabled."""
    if not cfg.metrics.enabled:
        return []
    master = cfg.mooncake_master
    targets: list[dict[str, object]] = [{
        "targets": [f"{master.node}:{master.metrics_port}"],
        "labels": {"stack": stack, "role": MOONCAKE_MASTER, "node": master.node},
    }]
    for name, group in cfg.groups.items():
        for rank, node in enumerate(group.nodes):
            targets.append({
                "targets": [f"{node}:{group.http_port}"],
                "labels": {"stack": stack, "role": rank_role(name, rank), "group": name,
                           "mode": group.mode, "rank": str(rank), "node": node},
            })
    door = cfg.router.door
    if door is not None:
        # Each door node: its door's exporter and the slot that runs there (both on one node).
        for node in cfg.door_nodes:
            slots = {name: slot.metrics_port for name, slot in door.slot_named().items()
                     if cfg.slot_node(name) == node}
            targets += door_targets(stack, node, door.metrics_port, slots,
                                    rust=cfg.router.kind == "rust")
    elif cfg.router.kind == "rust":
        targets.append({
            "targets": [f"{cfg.router.node}:{cfg.router.metrics_port}"],
            "labels": {"stack": stack, "role": ROUTER, "node": cfg.router.node},
        })
    return targets
