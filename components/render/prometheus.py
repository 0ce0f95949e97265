"""Prometheus targets: what the stack output prometheusTargets lists."""

from __future__ import annotations

from ..config import ClusterConfig
from .layout import MOONCAKE_MASTER, rank_role


def prometheus_targets(cfg: ClusterConfig, stack: str) -> list[dict[str, object]]:
    """A Prometheus file_sd_configs document: every SGLang rank's /metrics (rank 0 on the API
    port, ranks >= 1 on their dummy health server, same port) and the Mooncake master's metrics
    port. Empty unless metrics.enabled. MiniLB serves no metrics, so the router is not listed."""
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
    return targets
