"""The Mooncake master (mc-master): first to start, last to stop."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi

from .config import ClusterConfig
from .containers import node_container
from .gates import HealthGate
from .node import Node
from .render import MOONCAKE_MASTER, mooncake_master_command, mooncake_master_env, mooncake_master_health_url


class MooncakeMaster(pulumi.ComponentResource):
    """Mooncake's metadata service, gated on its metrics endpoint's /health."""

    address: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:mooncake:MooncakeMaster", MOONCAKE_MASTER, None, opts)
        node = nodes[cfg.mooncake_master.node]
        self.container = node_container(
            cfg, MOONCAKE_MASTER, node, mooncake_master_command(cfg), mooncake_master_env(cfg),
            gpu_workload=False, depends_on=[], parent=self)
        self.gate = HealthGate(f"{MOONCAKE_MASTER}-ready", cfg, node,
                               mooncake_master_health_url(cfg), self.container,
                               opts=pulumi.ResourceOptions(parent=self))
        self.address = pulumi.Output.from_input(
            f"{cfg.mooncake_master.node}:{cfg.mooncake_master.rpc_port}")
        self.register_outputs({"address": self.address})
