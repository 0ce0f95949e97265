"""ClusterConfig: the whole stack as one validated model, and the views derived from it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .base import Model
from .grammars import checked_image_reference
from .router_schema import SLOT_NAMES, RouterSpec
from .rules import RULES
from .rules.ports import PortBinding
from .rules.runbook import MOONCAKE_VERSION
from .schema import (
    ConnectionSpec,
    ContainerSpec,
    FirewallSpec,
    GatesSpec,
    GroupSpec,
    MetricsSpec,
    ModelSpec,
    MooncakeMasterSpec,
    NetworkSpec,
    NodeFileSpec,
    NodeSpec,
    PreflightSpec,
    SmokeTestSpec,
    VerificationSpec,
)


class ClusterConfig(Model):
    image: str
    # The Mooncake version the image itself ships; only consulted when no Mooncake wheel is
    # among nodeFiles (then the image's own version is what runs).
    image_mooncake_version: str | None = None
    model: ModelSpec
    nodes: list[NodeSpec] = Field(min_length=1)
    mooncake_master: MooncakeMasterSpec
    groups: dict[str, GroupSpec] = Field(min_length=1)
    router: RouterSpec
    node_files: list[NodeFileSpec] = []
    network: NetworkSpec = NetworkSpec()
    container: ContainerSpec = ContainerSpec()
    preflight: PreflightSpec = PreflightSpec()
    gates: GatesSpec = GatesSpec()
    smoke_test: SmokeTestSpec = SmokeTestSpec()
    connection: ConnectionSpec = ConnectionSpec()
    verification: VerificationSpec = VerificationSpec()
    metrics: MetricsSpec = MetricsSpec()
    firewall: FirewallSpec = FirewallSpec()
    # false: keep node preparation (files, image, preflight), remove every container.
    serving: bool = True
    # Bumping it replaces every container, in dependency order (the runbook's `restart`).
    restart_generation: int = Field(default=0, ge=0)
    # When decode may start. sequential (runbook rule 2 as run): once every prefill group is
    # healthy. overlapped: once each prefill rank 0's KV bootstrap server answers (SGLang 0.5.19
    # starts it before the model loads, and decode's start never dials prefill), so the two
    # loads overlap. Either way the router waits for every group's health gate.
    start_order: Literal["sequential", "overlapped"] = "sequential"
    # Where the node files' wheels and patches are installed. image: once per node during
    # preparation, into a prepared image every container runs (a failed install or patch, or an
    # old Mooncake, stops preparation before any container changes; containers start in
    # seconds). container-start: by launch.sh in every container as it starts (the runbook's way).
    install_node_files: Literal["image", "container-start"] = "image"
    # With the rust router, how a change that replaces several groups of one mode goes.
    # one-group-at-a-time: each group is drained only while another group of its mode is admitted
    # and healthy, so the router always has one (a rolling update; the first group is the canary).
    # all-at-once: every group drains and restarts together (the cluster is down for a load).
    rollout: Literal["one-group-at-a-time", "all-at-once"] = "one-group-at-a-time"

    @field_validator("image_mooncake_version", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # Pulumi.yaml's default is "" (its schema has no null).
        return value or None

    @field_validator("image_mooncake_version")
    @classmethod
    def _version_form(cls, value: str | None) -> str | None:
        if value is not None and not MOONCAKE_VERSION.match(value):
            raise ValueError(f"{value!r} is not a Mooncake version (X.Y.Z or X.Y.Z.postN), so it "
                             "cannot be compared with the minimum: write it as `pip show "
                             "mooncake-transfer-engine` prints it, e.g. 0.3.12.post1, or leave it "
                             "empty")
        return value

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        # Caught here rather than by `docker pull` on every node once their preparation started.
        return checked_image_reference(value, "[REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST]"
                                              " in lower case, e.g. lmsysorg/sglang:kimi-k3")

    # -- derived views (no component re-derives these) ------------------------------------

    @property
    def workers_keyed(self) -> bool:
        """Whether every SGLang server requires the router's key. The rust router registers each
        worker with it and forwards the client's own `Authorization` to prefill and decode, so
        one key serves client, router and workers; MiniLB forwards none (docs/decisions.md)."""
        return self.router.kind == "rust"

    def metrics_ports_on(self, address: str) -> list[int]:
        """Ports on this node that serve Prometheus metrics (the firewall's monitoring hosts)."""
        ports = {group.http_port for group in self.groups.values() if address in group.nodes}
        if self.mooncake_master.node == address:
            ports.add(self.mooncake_master.metrics_port)
        door = self.router.door
        if door is None:
            if self.router.node == address and self.router.kind == "rust":
                ports.add(self.router.metrics_port)
            return sorted(ports)
        if address in self.door_nodes:
            ports.add(door.metrics_port)
        if self.router.kind == "rust":
            ports |= {slot.metrics_port for name, slot in door.slot_named().items()
                      if self.slot_node(name) == address}
        return sorted(ports)

    @property
    def router_roles(self) -> list[str]:
        """The router's containers: one `router`, or each door and the two slots."""
        if self.router.door is None:
            return ["router"]
        return [*(self.door_role(node) for node in self.door_nodes),
                *(f"router-{name}" for name in SLOT_NAMES),
                *(self.keepalived_role(node) for node in self.virtual_ip_nodes)]

    @property
    def virtual_ip_nodes(self) -> list[str]:
        """The door nodes keepalived runs on: both, when a virtual IP moves between them; the one
        that stays, when the other is taken out (it carries the address alone)."""
        door = self.router.door
        return self.door_nodes if door is not None and door.nodes is not None and \
            door.virtual_ip is not None else []

    def keepalived_role(self, address: str) -> str:
        """keepalived on ADDRESS, named as the door there is: `keepalived` on router.node,
        `keepalived-A-B-C-D` on the other door node."""
        return "keepalived" + self.door_role(address).removeprefix("door")

    def door_role(self, address: str) -> str:
        """The door on ADDRESS: `door` on router.node (as with one door node), `door-A-B-C-D`
        on the other door node."""
        return "door" if address == self.router.node else "door-" + address.replace(".", "-")

    def slot_node(self, slot: str) -> str:
        """Where router slot SLOT runs: slot a on router.node; slot b on the other door node
        when the door stands on two, else on router.node too (and while the other door node is
        out, so that the door keeps two slots and a router change still costs no request)."""
        door = self.router.door
        if slot == SLOT_NAMES[0] or door is None or door.nodes is None:
            return self.router.node
        # Both the same, or router.node left out: refused (rules/door.py), but the other rules
        # run over the same config first.
        other = next((node for node in door.nodes if node != self.router.node), self.router.node)
        return self.router.node if other in self.out_nodes else other

    def slot_stands_in(self, slot: str) -> bool:
        """Whether SLOT (b) runs on router.node in place of the other door node, taken out."""
        door = self.router.door
        return (door is not None and door.nodes is not None and slot != SLOT_NAMES[0]
                and self.slot_node(slot) == self.router.node)

    @property
    def door_nodes(self) -> list[str]:
        """The nodes a door stands on: none, router.node, or router.door.nodes (two, one of
        them router.node) less a node taken out (`nodes[].out`)."""
        door = self.router.door
        if door is None:
            return []
        if door.nodes is None:
            return [self.router.node]
        out = self.out_nodes
        return [node for node in door.nodes if node not in out]

    def door_peer(self, address: str) -> str | None:
        """The other door node, when the door stands on two and a virtual IP moves between
        them: the only node whose VRRP this one accepts. Still that node while it is out:
        keepalived's configuration and the firewall stay as they were, so taking it out and
        putting it back reload neither on the node that stays."""
        door = self.router.door
        if door is None or door.nodes is None or door.virtual_ip is None:
            return None
        if address not in door.nodes:
            return None
        others = [node for node in door.nodes if node != address]
        return others[0] if others else None

    @property
    def out_nodes(self) -> list[str]:
        """The nodes taken out of service (`nodes[].out`), in declaration order."""
        return [node.address for node in self.nodes if node.out]

    def groups_leaving(self) -> dict[str, list[str]]:
        """Every group with a rank on a node taken out -> those nodes."""
        out = set(self.out_nodes)
        return {name: [address for address in group.nodes if address in out]
                for name, group in self.groups.items() if out & set(group.nodes)}

    def in_service(self) -> ClusterConfig:
        """The config the program deploys: without the groups that leave with the nodes taken
        out. The nodes themselves stay listed (every other node's firewall still admits them,
        so none is touched now or when they come back); the program prepares only those in."""
        leaving = self.groups_leaving()
        if not leaving:
            return self
        return self.model_copy(update={"groups": {name: group for name, group in
                                                  self.groups.items() if name not in leaving}})

    def node(self, address: str) -> NodeSpec:
        return next(node for node in self.nodes if node.address == address)

    def groups_in_mode(self, mode: str) -> dict[str, GroupSpec]:
        return {name: group for name, group in self.groups.items() if group.mode == mode}

    def roles_of(self, address: str) -> list[str]:
        roles = []
        if self.mooncake_master.node == address:
            roles.append("mooncake-master")
        for name, group in self.groups.items():
            if address in group.nodes:
                roles.append(f"{name}-r{group.nodes.index(address)}")
        if self.router.door is None:
            if self.router.node == address:
                roles.append("router")
            return roles
        if address in self.door_nodes:
            roles.append(self.door_role(address))
        roles += [f"router-{name}" for name in SLOT_NAMES if self.slot_node(name) == address]
        if address in self.virtual_ip_nodes:
            roles.append(self.keepalived_role(address))
        return roles

    def port_bindings(self) -> Iterator[PortBinding]:
        """Every port a container binds (host networking: the node's own). Every rank binds
        --port (ranks >= 1 SGLang's dummy health server), prefill rank 0 the bootstrap port,
        rank 0 of a multi-node group dist-init..+7."""
        master = self.mooncake_master
        yield PortBinding(master.node, master.rpc_port, "mooncakeMaster.rpcPort")
        yield PortBinding(master.node, master.metrics_port, "mooncakeMaster.metricsPort")
        for name, group in self.groups.items():
            for address in group.nodes:
                yield PortBinding(address, group.http_port, f"groups.{name}.httpPort", name)
            if group.mode == "prefill":
                yield PortBinding(group.rank0, group.bootstrap_port,
                                  f"groups.{name}.bootstrapPort", name)
            if len(group.nodes) > 1:
                for offset in range(8):
                    yield PortBinding(group.rank0, group.dist_init_port + offset,
                                      f"groups.{name}.distInitPort", name, offset)
        door = self.router.door
        if door is None:
            yield PortBinding(self.router.node, self.router.port, "router.port")
            if self.router.kind == "rust":
                yield PortBinding(self.router.node, self.router.metrics_port,
                                  "router.metricsPort")
            return
        # Every door binds router.port and its exporter on its own node.
        for node in self.door_nodes:
            yield PortBinding(node, self.router.port, "router.port")
            yield PortBinding(node, door.metrics_port, "router.door.metricsPort")
        for index, (name, slot) in enumerate(door.slot_named().items()):
            node = self.slot_node(name)
            yield PortBinding(node, slot.port, f"router.door.slots[{index}].port")
            if self.router.kind == "rust":
                yield PortBinding(node, slot.metrics_port,
                                  f"router.door.slots[{index}].metricsPort")
                yield PortBinding(node, slot.check_port,
                                  f"router.door.slots[{index}].pairCheckPort")

    def ports_on(self, address: str) -> dict[int, str]:
        """Every port this node's containers bind, in order -> the key that sets it."""
        return dict(sorted((binding.port, binding.key + (f"+{binding.offset}" if binding.offset
                                                          else ""))
                           for binding in self.port_bindings() if binding.node == address))

    # -- the runbook's hard rules and the cross-field checks --------------------------------

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        problems = [problem for rule in RULES for problem in rule(self)]
        if problems:
            raise ValueError("\n".join(problems))
        return self
