"""The firewall section's own rules."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


def open_ports_serve_nothing(cfg: ClusterConfig) -> Iterable[str]:
    """firewall.openPorts is for the node's own services: a serving port there would be open to
    anyone, which is what the firewall is for closing."""
    if not cfg.firewall.enabled:
        return
    serving = {binding.port: binding.key for binding in cfg.port_bindings()}
    for index, port in enumerate(cfg.firewall.open_ports):
        key = serving.get(port)
        if key is not None:
            yield (f"firewall.openPorts[{index}]: {port} is {key}, a serving port, which would "
                   "then answer anyone; remove it (clients reach the router through "
                   "firewall.clientNetworks, Prometheus the metrics ports through "
                   "firewall.monitoringHosts).")
