"""The end-to-end smoke test: POST /generate through the router."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from .config import ClusterConfig
from .door import Door
from .gates import HealthGate
from .node import Node
from .render import (
    smoke_test_command,
    smoke_test_text,
)
from .router import Router
from .router_readiness import RouterReadiness


class SmokeTest(pulumi.ComponentResource):
    """POST /generate through the router; its answer is a stack output.

    Health is not enough: with Mooncake #2511 every server is healthy and the first KV transfer
    fails. It runs again whenever the router or any gate (so any container) was replaced.
    """

    text: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, node: Node, routers: Sequence[Router],
                 gates: Sequence[HealthGate | RouterReadiness], doors: Sequence[Door] = (),
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:router:SmokeTest", "smoke-test", None, opts)
        # With the door: through it, once both slots are up there.
        at_door: list[pulumi.Resource] = [router.at_door for router in routers if router.at_door]
        # Every gate's checks are among its triggers, so it waits for them too (HealthGate says
        # why no depends_on repeats them).
        self.request = command.remote.Command(
            "smoke-test-generate",
            connection=node.connection,
            create=smoke_test_command(cfg),
            triggers=[*[router.container.id for router in routers],
                      *[check.id for gate in gates for check in gate.checks],
                      *[door.container.id for door in doors]],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                *[router.gate for router in routers], *at_door]),
        )
        self.text = self.request.stdout.apply(smoke_test_text)
        self.register_outputs({"text": self.text})
