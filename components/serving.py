"""A multi-node SGLang server: every rank of one prefill or decode group, and its gate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi

from .config import ClusterConfig
from .containers import node_container
from .gates import HealthGate
from .node import Node
from .render import group_endpoint, sglang_rank_plan


class ServingGroup(pulumi.ComponentResource):
    """One container per rank; ready when rank 0 answers /health and every other rank its dummy
    /health (SGLang starts it once that rank has loaded its model)."""

    endpoint: pulumi.Output[str]

    def __init__(self, name: str, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 wait_for: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:serving:ServingGroup", name, None, opts)
        group = cfg.groups[name]
        plans = [sglang_rank_plan(cfg, name, rank) for rank in range(len(group.nodes))]
        self.containers = [
            node_container(plan, nodes[plan.node], depends_on=wait_for, parent=self)
            for plan in plans
        ]
        self.gate = HealthGate(f"{name}-ready", cfg, nodes, plans, self.containers,
                               opts=pulumi.ResourceOptions(parent=self))
        self.endpoint = pulumi.Output.from_input(group_endpoint(group))
        self.register_outputs({"endpoint": self.endpoint})
