"""Readiness gates: what a later step waits for instead of a sleep."""

from __future__ import annotations

from collections.abc import Sequence

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
    container's log. Its triggers are the ids of every container it stands for (all ranks of a
    group): a replaced or recreated rank runs the gate again, a no-op `up` runs nothing.
    """

    def __init__(self, name: str, cfg: ClusterConfig, node: Node, plan: ContainerPlan,
                 containers: Sequence[docker.Container],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:gates:HealthGate", name, None, opts)
        assert plan.health_url is not None, f"{plan.role} serves no HTTP to gate on"
        self.check = command.remote.Command(
            f"{name}-check",
            connection=node.connection,
            create=wait_healthy_command(cfg, plan.health_url, plan.name),
            triggers=[container.id for container in containers],
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(containers)),
        )
        self.url = plan.health_url
        self.register_outputs({"url": self.url})
