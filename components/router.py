"""The PD router, each group's membership in it, and the end-to-end smoke test through it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from .config import ClusterConfig
from .containers import node_container
from .gates import HealthGate
from .node import Node
from .render import (
    admit_command,
    door_haproxy_config,
    door_bridge_command,
    door_bridge_retire_command,
    door_plan,
    door_spec,
    door_url,
    remove_door_files_command,
    slot_admit_command,
    slot_door_admit_command,
    slot_door_drain_command,
    slot_drain_command,
    slot_unwant_command,
    slot_want_command,
    write_door_config_command,
    write_door_tls_command,
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


class RouterApiKey(pulumi.ComponentResource):
    """The rust router's key on a router node, in a file only root reads (every slot on the node
    reads it, and the scripts that talk to the slots on router.node)."""

    def __init__(self, cfg: ClusterConfig, node: Node, api_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        # router.node's keeps its names; the other door node's (slot b's) names the node.
        suffix = "" if node.address == cfg.router.node else "-" + node.address.replace(".", "-")
        super().__init__("kimipd:router:RouterApiKey", f"router-key{suffix}", None, opts)
        # The secret reaches the node on stdin. A new key is a new file resource, whose id each
        # router carries as a label: the routers restart with it, and every group is admitted
        # again.
        self.file = command.remote.Command(
            f"router-api-key{suffix}",
            connection=node.connection,
            create=write_api_key_command(cfg),
            delete=f"rm -f {router_api_key_file(cfg)} {router_auth_header_file(cfg)}",
            stdin=api_key,
            triggers=[api_key],
            opts=pulumi.ResourceOptions(parent=self, depends_on=node.ready,
                                        delete_before_replace=True,
                                        # It was the (one) router's own child.
                                        aliases=[pulumi.Alias(parent=_old_router_urn())]
                                        if not suffix else None))
        self.register_outputs({})


def _component_urn(type_: str, name: str) -> str:
    return (f"urn:pulumi:{pulumi.get_stack()}::{pulumi.get_project()}::"
            f"kimipd:cluster:Cluster${type_}::{name}")


def _old_router_urn() -> str:
    return _component_urn("kimipd:router:Router", "router")


def _single_router_container_alias() -> pulumi.Alias:
    """The single router's container, as the door's container on router.node knows it."""
    return pulumi.Alias(name="router", parent=_old_router_urn())


def _door_container_alias() -> pulumi.Alias:
    """router.node's door container, as the single router's container knows it (a stack
    leaving the door)."""
    return pulumi.Alias(name="door", parent=_component_urn("kimipd:router:Door", "door"))


class Door(pulumi.ComponentResource):
    """HAProxy on a door node (router.node, and with router.door.nodes the other one too),
    owning router.port in front of the two router slots.

    Its configuration is a file the door reloads (master-worker: the listener stays open), so a
    change of it refuses no connection. A new door image replaces the container through the
    bridge, which holds the listening sockets meanwhile (door_bridge_command), so that refuses
    none either. AFTER: the door before this one (with two door nodes), whose new container
    serves before this door's changes start: a bad image stops at the first node. Every
    resource of router.node's door keeps the names it had with one door node; the other door
    node's are named by its role (door-A-B-C-D)."""

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node], address: str,
                 tls_key: pulumi.Input[str] | None, after: Door | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = door_plan(cfg, address)
        role = plan.role
        super().__init__("kimipd:router:Door", role, None, opts)
        self.role, self.address = role, address
        node = nodes[address]
        spec = door_spec(cfg)
        child = pulumi.ResourceOptions(parent=self)
        self.image = docker.RemoteImage(
            f"{role}-image", name=spec.image, keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=node.provider,
                                        depends_on=node.ready))
        files: list[pulumi.Resource] = []
        if spec.tls is not None:
            if tls_key is None:
                raise ValueError("router.door.tls needs the secret doorTlsKey")
            self.tls = command.remote.Command(
                f"{role}-tls",
                connection=node.connection,
                create=write_door_tls_command(cfg),
                update=write_door_tls_command(cfg),
                # Certificate, then key: one PEM, as HAProxy's `crt` reads it.
                stdin=pulumi.Output.secret(pulumi.Output.concat(
                    spec.tls.certificate.strip(), "\n", tls_key)),
                opts=pulumi.ResourceOptions(parent=self, depends_on=node.ready))
            files.append(self.tls)
        # Changed in place (update): the door reloads it, keeping its listener.
        self.config = command.remote.Command(
            f"{role}-config",
            connection=node.connection,
            create=write_door_config_command(cfg),
            update=write_door_config_command(cfg),
            delete=remove_door_files_command(cfg),
            stdin=door_haproxy_config(cfg),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.image, *files]))
        # Replaced with the container (the same inputs: the image and the plan), before it: a
        # HAProxy of the new image takes the running door's listening sockets, serves while the
        # old door finishes its streams and the new one starts, and gives them to the new one.
        previous = [after.gate, after.retire] if after is not None else []
        self.bridge = command.remote.Command(
            f"{role}-bridge",
            connection=node.connection,
            create=self.image.image_id.apply(lambda image: door_bridge_command(cfg, image)),
            triggers=[self.image.image_id, repr(plan)],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.config, *previous]))
        # Removed with SIGUSR1 (door_plan): its open streams get as long as a slot's.
        # router.node's door holds router.port where the single router did: it is that
        # container's replacement, so the router goes before the door binds the port (a stack
        # moving to the door; docs/decisions.md).
        self.container = node_container(plan, node, depends_on=[self.config, self.bridge],
                                        parent=self,
                                        image=self.image.image_id,
                                        aliases=[_single_router_container_alias()]
                                        if address == cfg.router.node else (),
                                        stop_grace_seconds=cfg.router.drain_timeout_seconds + 5)
        self.gate = HealthGate(f"{role}-ready", cfg, nodes, [plan], [self.container], opts=child)
        # The bridge's soft stop, once the new door has loaded (else the bridge goes on serving).
        self.retire = command.remote.Command(
            f"{role}-bridge-retire",
            connection=node.connection,
            create=door_bridge_retire_command(),
            triggers=[self.container.id, self.bridge.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.gate]))
        self.url = door_url(cfg)
        self.register_outputs({"url": self.url})


class Router(pulumi.ComponentResource):
    """sglang-router in PD mode: the one on router.port, or one of the door's two slots. MiniLB
    starts once every group is ready (its worker list is fixed); the rust router starts with
    the nodes, and each group's Membership admits it."""

    url: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 wait_for: Sequence[pulumi.Resource], api_key: RouterApiKey | None = None,
                 slot: str | None = None, doors: Sequence[Door] = (),
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = router_plan(cfg, slot)
        super().__init__("kimipd:router:Router", plan.role, None, opts)
        self.role = plan.role
        node = nodes[plan.node]
        # Slot b standing in on router.node (the other door node out): its container and gate
        # check under names of their own, so the copies on the node out are deleted (left out
        # and dropped by `kimipd up`) and these created, not moved (docs/decisions.md).
        placed = (f"{plan.role}-stand-in" if slot is not None and cfg.slot_stands_in(slot)
                  else plan.role)
        # Where the markers, the leases and the scripts that talk to every slot are: router.node
        # (slot b on the other door node included, reached at its node's address).
        state_node = nodes[cfg.router.node]
        extra_labels: dict[str, pulumi.Input[str]] = {}
        key_files: list[pulumi.Resource] = []
        if api_key is not None:
            extra_labels["kimipd.api-key-file"] = api_key.file.id
            key_files.append(api_key.file)
        # The node's pulled image, not the prepared one: the node files (Mooncake, patches) are
        # nothing to the router, so a change of them rolls the groups and leaves the router up.
        self.container = node_container(
            plan, node, depends_on=[*wait_for, *key_files],
            parent=self, extra_labels=extra_labels, resource_name=placed,
            # The single router on router.port replaces the door's container there.
            aliases=[_door_container_alias()] if slot is None else (),
            image=node.image_id if cfg.router.kind == "rust" else None,
            stop_grace_seconds=(cfg.router.drain_timeout_seconds + 5
                                if cfg.router.kind == "rust" else None))
        self.gate = HealthGate(f"{placed}-ready", cfg, nodes, [plan], [self.container],
                               opts=pulumi.ResourceOptions(parent=self), check_prefix=placed)
        self.restore: command.remote.Command | None = None
        if cfg.router.kind == "rust":
            # A new router starts with no worker: the groups already serving join it at once,
            # without waiting for their admissions (which also wait for their own gates).
            self.restore = command.remote.Command(
                f"{plan.role}-restore",
                connection=state_node.connection,
                create=restore_command(cfg, slot),
                triggers=[self.container.id],
                # Its old copy goes first (it has no delete command): when slot b moves off a
                # node out, a copy left to be deleted last depends on that node's resources,
                # which `kimipd up` leaves out, and kept the state from dropping them.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.gate],
                                            delete_before_replace=True))
        self.at_door: command.remote.Command | None = None
        if slot is not None and doors:
            self._behind_doors(cfg, nodes, slot, doors)
        self.url = pulumi.Output.from_input(router_url(cfg))
        self.register_outputs({"url": self.url})

    def _behind_doors(self, cfg: ClusterConfig, nodes: Mapping[str, Node], slot: str,
                      doors: Sequence[Door]) -> None:
        """The slot's place at each door, like a group's in the router (render/membership.py):
        drained at every door before its container goes, set ready at each once it serves.
        router.node's door decides (the slot lease and the markers are there); the other door
        node's follows: drained after it, ready before it gives the lease back."""
        role = self.role
        node = nodes[cfg.router.node]
        door = next(door for door in doors if door.address == cfg.router.node)
        others = [other for other in doors if other is not door]
        # Deleted after router.node's drain (which depends on them): no new request at either
        # door, then this door's open ones end.
        self.other_door_drains = [
            command.remote.Command(
                f"{role}-{other.role}-drain",
                connection=nodes[other.address].connection,
                create="true",
                delete=slot_door_drain_command(cfg, slot),
                triggers=[self.container.id],
                opts=pulumi.ResourceOptions(parent=self,
                                            depends_on=[self.container, other.container]))
            for other in others]
        # Replaced with the container, deleted before it: its delete is the drain, which waits
        # for the slot lease (the other slot up at the door): Pulumi alone would replace both
        # slots at once (delete-before-replace deletes dependents first). Deleted before its
        # own replacement too: when slot b moves (a container of another name), the old drain
        # would otherwise run last, after the new slot's admission.
        self.door_drain = command.remote.Command(
            f"{role}-door-drain",
            connection=node.connection,
            create="true",
            delete=slot_drain_command(cfg, slot),
            triggers=[self.container.id],
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=[
                self.container, door.container, *self.other_door_drains]))
        # "This slot should serve": gone first on destroy, so the drain then waits for nothing.
        self.door_want = command.remote.Command(
            f"{role}-door-want",
            connection=node.connection,
            create=slot_want_command(cfg, slot),
            delete=slot_unwant_command(cfg, slot),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.door_drain]))
        restored = [self.restore] if self.restore else []
        # Ready at the other door node's door first: router.node's admission gives the lease
        # back, and the other slot's drain may then start.
        self.other_door_admits = [
            command.remote.Command(
                f"{role}-{other.role}-admit",
                connection=nodes[other.address].connection,
                create=slot_door_admit_command(cfg, slot),
                triggers=[self.container.id],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[
                    self.gate, other.gate, self.door_want, drain, *restored]))
            for other, drain in zip(others, self.other_door_drains, strict=True)]
        self.at_door = command.remote.Command(
            f"{role}-door-admit",
            connection=node.connection,
            create=slot_admit_command(cfg, slot),
            triggers=[self.container.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                self.gate, door.gate, self.door_want, self.door_drain, *restored,
                *self.other_door_admits]))


class Membership(pulumi.ComponentResource):
    """One group's place in the rust router: drained before its containers go, admitted once its
    gate passes (render/membership.py says why these are three commands)."""

    def __init__(self, name: str, cfg: ClusterConfig, node: Node, routers: Sequence[Router],
                 group: ServingGroup, opts: pulumi.ResourceOptions | None = None) -> None:
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
        self.admit = command.remote.Command(
            f"{name}-admit",
            connection=node.connection,
            create=admit_command(cfg, name),
            triggers=[*[router.container.id for router in routers],
                      *[check.id for check in group.gate.checks]],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                self.want, self.drain,
                *[router.gate for router in routers],
                *[router.restore for router in routers if router.restore]]))
        self.register_outputs({})


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
