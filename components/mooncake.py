"""The Mooncake master (mc-master): first to start, last to stop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi

from .config import ClusterConfig
from .containers import node_container
from .gates import HealthGate
from .node import Node
from .render import mooncake_master_address, mooncake_master_plan


class MooncakeMaster(pulumi.ComponentResource):
    """Mooncake's metadata service, gated on its metrics endpoint's /health."""

    address: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 wait_for: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = mooncake_master_plan(cfg)
        super().__init__("kimipd:mooncake:MooncakeMaster", plan.role, None, opts)
        node = nodes[plan.node]
        self.container = node_container(plan, node, depends_on=wait_for, parent=self)
        self.gate = HealthGate(f"{plan.role}-ready", cfg, nodes, [plan], [self.container],
                               opts=pulumi.ResourceOptions(parent=self))
        self.address = pulumi.Output.from_input(mooncake_master_address(cfg))
        self.register_outputs({"address": self.address})
