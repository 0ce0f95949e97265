"""Readiness gates: what a later step waits for instead of a sleep."""

from __future__ import annotations

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from .config import ClusterConfig
from .node import Node
from .render import ContainerPlan, wait_healthy_command


class HealthGate(pulumi.ComponentResource):
    """Polls the plan's health URL from the container's own node until HTTP 200; fails with
    the container's log tail.

    It polls on the node because only the node is sure to reach the compute network and the
    container's log. Its trigger is the container's id: a replaced container runs the gate
    again, a no-op `up` runs nothing.
    """

    def __init__(self, name: str, cfg: ClusterConfig, node: Node, plan: ContainerPlan,
                 container: docker.Container,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:gates:HealthGate", name, None, opts)
        assert plan.health_url is not None, f"{plan.role} serves no HTTP to gate on"
        self.check = command.remote.Command(
            f"{name}-check",
            connection=node.connection,
            create=wait_healthy_command(cfg, plan.health_url, plan.name),
            triggers=[container.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[container]),
        )
        self.url = plan.health_url
        self.register_outputs({"url": self.url})
