"""The rust router's gate: every group registered and healthy in every slot."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from .config import ClusterConfig
from .membership import Membership
from .node import Node
from .render import (
    router_ready_command,
)
from .router import Router


class RouterReadiness(pulumi.ComponentResource):
    """The rust router's gate: /readiness, and every group registered and healthy (in every
    slot, with the door)."""

    def __init__(self, cfg: ClusterConfig, node: Node, routers: Sequence[Router],
                 memberships: Sequence[Membership],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:router:RouterReadiness", "router-readiness", None, opts)
        # Its triggers are also what it waits for: every router and every admission.
        self.check = command.remote.Command(
            "router-every-group-healthy",
            connection=node.connection,
            create=router_ready_command(cfg),
            triggers=[*[router.container.id for router in routers],
                      *[m.admit.id for m in memberships]],
            opts=pulumi.ResourceOptions(parent=self))
        self.checks = [self.check]
        self.register_outputs({})
