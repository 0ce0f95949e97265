"""The PD router, each group's membership in it, and the end-to-end smoke test through it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command

from .config import ClusterConfig
from .containers import node_container
from .gates import HealthGate
from .node import Node
from .render import (
    admit_command,
    drain_command,
    restore_command,
    router_api_key_file,
    router_auth_header_file,
    router_plan,
    router_ready_command,
    router_url,
    smoke_test_command,
    smoke_test_text,
    unwant_command,
    want_command,
    write_api_key_command,
)
from .serving import ServingGroup


class Router(pulumi.ComponentResource):
    """sglang-router in PD mode. MiniLB starts once every group is ready (its worker list is
    fixed); the rust router starts with the nodes, and each group's Membership admits it."""

    url: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 wait_for: Sequence[pulumi.Resource], api_key: pulumi.Input[str] | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = router_plan(cfg)
        super().__init__("kimipd:router:Router", plan.role, None, opts)
        node = nodes[plan.node]
        self.api_key_file: command.remote.Command | None = None
        extra_labels: dict[str, pulumi.Input[str]] = {}
        if api_key is not None:
            # The secret reaches the node on stdin, into a file only root reads. A new key is a
            # new file resource, whose id the router carries as a label: the router restarts
            # with it, and every group is admitted again.
            key_file = router_api_key_file(cfg)
            self.api_key_file = command.remote.Command(
                "router-api-key",
                connection=node.connection,
                create=write_api_key_command(cfg),
                delete=f"rm -f {key_file} {router_auth_header_file(cfg)}",
                stdin=api_key,
                triggers=[api_key],
                opts=pulumi.ResourceOptions(parent=self, depends_on=node.ready,
                                            delete_before_replace=True))
            extra_labels["kimipd.api-key-file"] = self.api_key_file.id
        # The node's pulled image, not the prepared one: the node files (Mooncake, patches) are
        # nothing to the router, so a change of them rolls the groups and leaves the router up.
        self.container = node_container(
            plan, node, depends_on=[*wait_for, *([self.api_key_file] if self.api_key_file else [])],
            parent=self, extra_labels=extra_labels,
            image=node.image_id if cfg.router.kind == "rust" else None,
            stop_grace_seconds=(cfg.router.drain_timeout_seconds + 5
                                if cfg.router.kind == "rust" else None))
        self.gate = HealthGate(f"{plan.role}-ready", cfg, nodes, [plan], [self.container],
                               opts=pulumi.ResourceOptions(parent=self))
        self.restore: command.remote.Command | None = None
        if cfg.router.kind == "rust":
            # A new router starts with no worker: the groups already serving join it at once,
            # without waiting for their admissions (which also wait for their own gates).
            self.restore = command.remote.Command(
                "router-restore",
                connection=node.connection,
                create=restore_command(cfg),
                triggers=[self.container.id],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.gate]))
        self.url = pulumi.Output.from_input(router_url(cfg))
        self.register_outputs({"url": self.url})


class Membership(pulumi.ComponentResource):
    """One group's place in the rust router: drained before its containers go, admitted once its
    gate passes (render/membership.py says why these are three commands)."""

    def __init__(self, name: str, cfg: ClusterConfig, node: Node, router: Router,
                 group: ServingGroup, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:router:Membership", name, None, opts)
        # Replaced with the group's containers (rank 0's id: whatever replaces rank 0 replaces
        # the group), and deleted before them: its delete is the drain.
        self.drain = command.remote.Command(
            f"{name}-drain",
            connection=node.connection,
            create="true",
            delete=drain_command(cfg, name),
            triggers=[group.containers[0].id],
            opts=pulumi.ResourceOptions(parent=self,
                                        depends_on=[*group.containers, router.container]))
        # Outlives replacements; deleted first when the group leaves the config or the stack is
        # destroyed, so the drain then removes the group without waiting for a peer.
        self.want = command.remote.Command(
            f"{name}-want",
            connection=node.connection,
            create=want_command(cfg, name),
            delete=unwant_command(cfg, name),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.drain]))
        self.admit = command.remote.Command(
            f"{name}-admit",
            connection=node.connection,
            create=admit_command(cfg, name),
            triggers=[router.container.id, *[check.id for check in group.gate.checks]],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                group.gate, router.gate, self.want, self.drain,
                *([router.restore] if router.restore else [])]))
        self.register_outputs({})


class RouterReadiness(pulumi.ComponentResource):
    """The rust router's gate: /readiness, and every group registered and healthy."""

    def __init__(self, cfg: ClusterConfig, node: Node, router: Router,
                 memberships: Sequence[Membership],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:router:RouterReadiness", "router-readiness", None, opts)
        self.check = command.remote.Command(
            "router-every-group-healthy",
            connection=node.connection,
            create=router_ready_command(cfg),
            triggers=[router.container.id, *[m.admit.id for m in memberships]],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[m.admit for m in memberships]))
        self.checks = [self.check]
        self.register_outputs({})


class SmokeTest(pulumi.ComponentResource):
    """POST /generate through the router; its answer is a stack output.

    Health is not enough: with Mooncake #2511 every server is healthy and the first KV transfer
    fails. It runs again whenever the router or any gate (so any container) was replaced.
    """

    text: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, node: Node, router: Router,
                 gates: Sequence[HealthGate | RouterReadiness],
                 opts: pulumi.ResourceOptions | None = None) -> None:
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
