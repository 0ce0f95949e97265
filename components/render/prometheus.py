"""Prometheus targets: what the stack output prometheusTargets lists."""

from __future__ import annotations

from ..config import ClusterConfig
from .layout import MOONCAKE_MASTER, ROUTER, rank_role


def prometheus_targets(cfg: ClusterConfig, stack: str) -> list[dict[str, object]]:
    """A Prometheus file_sd_configs document: every SGLang rank's /metrics (rank 0 on the API
    port, ranks >= 1 on their dummy health server, same port) and the Mooncake master's metrics
    port, and the rust router's metrics port (MiniLB serves none). Empty unless metrics.enabled."""
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
    if cfg.router.kind == "rust":
        targets.append({
            "targets": [f"{cfg.router.node}:{cfg.router.metrics_port}"],
            "labels": {"stack": stack, "role": ROUTER, "node": cfg.router.node},
        })
    return targets
