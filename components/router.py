"""The PD router and the end-to-end smoke test through it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command

from .config import ClusterConfig
from .containers import node_container
from .gates import HealthGate
from .node import Node
from .render import router_plan, router_url, smoke_test_command, smoke_test_text


class Router(pulumi.ComponentResource):
    """sglang-router in PD mode, started once every decode group is ready."""

    url: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 wait_for: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = router_plan(cfg)
        super().__init__("kimipd:router:Router", plan.role, None, opts)
        node = nodes[plan.node]
        self.container = node_container(plan, node, depends_on=wait_for, parent=self)
        self.gate = HealthGate(f"{plan.role}-ready", cfg, nodes, [plan], [self.container],
                               opts=pulumi.ResourceOptions(parent=self))
        self.url = pulumi.Output.from_input(router_url(cfg))
        self.register_outputs({"url": self.url})


class SmokeTest(pulumi.ComponentResource):
    """POST /generate through the router; its answer is a stack output.

    Health is not enough: with Mooncake #2511 every server is healthy and the first KV transfer
    fails. It runs again whenever the router or any gate (so any container) was replaced.
    """

    text: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, node: Node, router: Router,
                 gates: Sequence[HealthGate], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:router:SmokeTest", "smoke-test", None, opts)
        self.request = command.remote.Command(
            "smoke-test-generate",
            connection=node.connection,
            create=smoke_test_command(cfg),
            triggers=[router.container.id,
                      *[check.id for gate in gates for check in gate.checks]],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[router.gate, *gates]),
        )
        self.text = self.request.stdout.apply(smoke_test_text)
        self.register_outputs({"text": self.text})
