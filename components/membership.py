"""One group's place in the rust router: drained, wanted, admitted."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from .config import ClusterConfig
from .node import Node
from .render import (
    admit_command,
    drain_command,
    unwant_command,
    want_command,
)
from .router import Router
from .serving import ServingGroup


class Membership(pulumi.ComponentResource):
    """One group's place in the rust router: drained before its containers go, admitted once its
    gate passes (render/membership.py says why these are three commands)."""

    def __init__(self, name: str, cfg: ClusterConfig, node: Node, routers: Sequence[Router],
                 group: ServingGroup, contract: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:router:Membership", name, None, opts)
        # With the door, every slot: the group is registered with both.
        # Replaced with the group's containers (rank 0's id: whatever replaces rank 0 replaces
        # the group), and deleted before them: its delete is the drain. The trigger makes it
        # depend on rank 0, so depends_on names the other ranks only (HealthGate says why).
        self.drain = command.remote.Command(
            f"{name}-drain",
            connection=node.connection,
            create="true",
            delete=drain_command(cfg, name),
            triggers=[group.containers[0].id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                *group.containers[1:], *[router.container for router in routers]]))
        # Outlives replacements; deleted first when the group leaves the config or the stack is
        # destroyed, so the drain then removes the group without waiting for a peer.
        self.want = command.remote.Command(
            f"{name}-want",
            connection=node.connection,
            create=want_command(cfg, name),
            delete=unwant_command(cfg, name),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.drain]))
        # The gate's checks are among its triggers, so it waits for them too (HealthGate says
        # why no depends_on repeats them).
        # CONTRACT (render/contract.py: the config's, and the image its node holds) is in its
        # command: a change of it is an update, which runs the admission again when the group's
        # containers stay.
        self.admit = command.remote.Command(
            f"{name}-admit",
            connection=node.connection,
            create=pulumi.Output.from_input(contract).apply(
                lambda declared: admit_command(cfg, name, declared)),
            triggers=[*[router.container.id for router in routers],
                      *[check.id for check in group.gate.checks]],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                self.want, self.drain,
                *[router.gate for router in routers],
                *[router.restore for router in routers if router.restore]]))
        self.register_outputs({})
