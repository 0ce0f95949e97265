"""Readiness gates: what a later step waits for instead of a sleep."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from .config import ClusterConfig
from .node import Node
from .render import (
    ContainerPlan,
    bootstrap_url,
    rank_role,
    wait_bootstrap_command,
    wait_healthy_command,
)


class HealthGate(pulumi.ComponentResource):
    """Ready when every container it stands for answers its health URL with HTTP 200.

    One check per container, each polling on that container's own node: only the node is sure to
    reach the compute network and the container's state and log, so a rank that died fails its
    own check with its node, container and log tail. For a group that is every rank: rank 0's
    /health (warmed up) and each other rank's dummy /health (its model loaded). Every check is
    triggered by the ids of all the group's containers: a replaced rank re-runs the whole gate,
    a no-op `up` runs nothing. Those ids also make it wait for every container (an input that is
    another resource's output is a dependency), so no depends_on repeats them: the SDK's cycle
    check walks the graph behind each dependency it is given, once per mention (issue 29).
    """

    def __init__(self, name: str, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 plans: Sequence[ContainerPlan], containers: Sequence[docker.Container],
                 opts: pulumi.ResourceOptions | None = None,
                 check_prefix: str | None = None, fingerprint: bool = False) -> None:
        super().__init__("kimipd:gates:HealthGate", name, None, opts)
        container_ids = [container.id for container in containers]
        # FINGERPRINT (a group): the first plan's check, rank 0's, also reads the checkpoint.
        self.checks = [
            command.remote.Command(
                f"{check_prefix or plan.role}-health",
                connection=nodes[plan.node].connection,
                create=wait_healthy_command(cfg, plan, fingerprint and index == 0),
                triggers=container_ids,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for index, plan in enumerate(plans)
        ]
        self.urls = [plan.health_url for plan in plans]
        self.register_outputs({"urls": self.urls})


class BootstrapGate(pulumi.ComponentResource):
    """Ready when a prefill group's rank 0 KV bootstrap server answers HTTP (any status).

    What decode waits for with `startOrder: overlapped`. Runbook rule 2 asks that prefill's
    bootstrap server exist before decode starts; SGLang 0.5.19 starts it before rank 0 waits for
    the model to load, and decode's own start never dials prefill (its warm-up uses a fake
    bootstrap host), so the two groups load at once. One check on rank 0's node, like the health
    gates, failing at once if rank 0 stops. It is triggered by every rank of the group, which
    makes it depend on each (as HealthGate), so destroy still removes decode before any prefill
    rank.
    """

    def __init__(self, name: str, cfg: ClusterConfig, group_name: str, nodes: Mapping[str, Node],
                 containers: Sequence[docker.Container],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:gates:BootstrapGate", name, None, opts)
        group = cfg.groups[group_name]
        self.check = command.remote.Command(
            f"{rank_role(group_name, 0)}-bootstrap",
            connection=nodes[group.rank0].connection,
            create=wait_bootstrap_command(cfg, group_name),
            triggers=[container.id for container in containers],
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.checks = [self.check]
        self.url = bootstrap_url(group)
        self.register_outputs({"url": self.url})
