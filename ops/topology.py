"""The stack's topology as the operator tools use it, read from its outputs through the program's
own model (components/outputs.py): `Topology.from_outputs` validates them and refuses outputs of
another version, with what to do; nothing here re-derives a name the program gave."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from components.outputs import DoorOutput, GroupOutput, OutputsError, read_outputs
from components.render import DOOR, MOONCAKE_MASTER, ROUTER, rank_role

from .errors import StackError

# The door's backend in haproxy.cfg, where the slots are servers (`show stat`'s pxname).
DOOR_BACKEND = "slots"


@dataclass(frozen=True)
class ContainerRef:
    """One entry of the `containers` output, with its group and rank when it is an SGLang rank."""

    role: str
    node: str
    name: str
    health_url: str
    group: str | None = None
    rank: int | None = None
    # The door's slot this router is ("a", "b"), for the roles router-a and router-b.
    slot: str | None = None

    @property
    def is_router(self) -> bool:
        """The single router, or one of the door's slots (a slot is a router)."""
        return self.role == ROUTER or self.slot is not None


@dataclass(frozen=True)
class Slot:
    """One router behind the door, as the `door` output's `slots` list it."""

    name: str  # "a" | "b"
    url: str  # the slot's own port, e.g. http://NODE:31001
    role: str  # router-a
    container: str  # kimipd-router-a
    server: str  # its server in the door's backend (runtime API), slot-a
    metrics_port: int | None = None
    # Its restore on router.node (rust): registers every group that should serve and it lacks.
    restore: str | None = None
    # What the door asks of it: the pair check beside a rust router; None: url + /health.
    check_url: str | None = None


@dataclass(frozen=True)
class DoorNode:
    """One of the two door nodes (the `door` output's `nodes`): its door and its keepalived."""

    address: str
    door_role: str  # door on router.node, door-A-B-C-D on the other
    door_container: str
    keepalived_role: str  # keepalived, keepalived-A-B-C-D
    keepalived_container: str
    # Where keepalived's notify FIFO's reader writes the instance's state on this node.
    state_file: str
    # This node's door's runtime API.
    admin_socket: str = ""


@dataclass(frozen=True)
class VirtualIp:
    """The address clients use, moved between the door nodes by keepalived (VRRP)."""

    address: str
    prefix_length: int
    interface: str
    vrid: int


@dataclass(frozen=True)
class Door:
    """The `door` output: HAProxy on the router's node owning router.port (on two door nodes,
    one door on each and a virtual IP between them)."""

    url: str  # http(s)://NODE:PORT, what routerUrl says
    tls: bool
    node: str
    admin_socket: str  # the runtime API's UNIX socket on NODE
    container: str
    slots: tuple[Slot, ...]
    metrics_url: str | None = None
    backend: str = DOOR_BACKEND
    # Both door nodes, router.node first; () with a door on router.node alone.
    nodes: tuple[DoorNode, ...] = ()
    virtual_ip: VirtualIp | None = None
    # A door node taken out (`nodes[].out`): not in `nodes`, not asked.
    nodes_out: tuple[str, ...] = ()
    # On `node` (rust router): the rollout's record, rollout.json (ops/rollout.py).
    state_dir: str | None = None
    # With client keys: the door's stick table of requests per client; None without.
    clients_table: str | None = None

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or (443 if self.tls else 80)

    def slot(self, name: str) -> Slot | None:
        return next((slot for slot in self.slots if slot.name == name), None)

    @classmethod
    def from_output(cls, door: DoorOutput) -> Door:
        slots = tuple(Slot(name=name, url=slot.url, role=slot.role, container=slot.container,
                           server=slot.server, metrics_port=slot.metrics_port,
                           restore=slot.restore, check_url=slot.check_url)
                      for name, slot in sorted(door.slots.items()))
        nodes = tuple(DoorNode(address=address, door_role=entry.role,
                               door_container=entry.container,
                               keepalived_role=entry.keepalived.role,
                               keepalived_container=entry.keepalived.container,
                               state_file=entry.keepalived.state_file,
                               admin_socket=entry.admin_socket)
                      for address, entry in (door.nodes or {}).items())
        vip = door.virtual_ip
        return cls(url=door.url, tls=door.tls, node=door.node, admin_socket=door.admin_socket,
                   container=door.container, slots=slots, metrics_url=door.metrics_url,
                   nodes=tuple(sorted(nodes, key=lambda node: (node.address != door.node,
                                                               address_key(node.address)))),
                   virtual_ip=(VirtualIp(address=vip.address, prefix_length=vip.prefix_length,
                                         interface=vip.interface, vrid=vip.vrid)
                               if vip is not None else None),
                   nodes_out=tuple(door.nodes_out or ()), state_dir=door.state_dir,
                   clients_table=door.clients_table)


@dataclass(frozen=True)
class Topology:
    """The stack's outputs, in the runbook's order: mc-master, prefill, decode, then the routers
    (the door, the router or the door's slots)."""

    stack: str
    serving: bool
    restart_generation: int | None
    router_url: str | None
    generate_url: str | None
    containers: tuple[ContainerRef, ...]
    groups: Mapping[str, GroupOutput]
    nodes: tuple[str, ...]
    # `inet kimipd_PORT` when the stack's firewall is on (its `firewall` output), else None.
    firewall_table: str | None = None
    # The `door` output: None for a stack with a single router on router.port.
    door: Door | None = None

    @classmethod
    def from_outputs(cls, stack: str, outputs: Mapping[str, Any]) -> Topology:
        """Outputs the model validates; none at all (a stack never deployed, destroyed, or whose
        first `up` was killed) is a stack with nothing to ask."""
        if not outputs:
            return cls(stack=stack, serving=False, restart_generation=None, router_url=None,
                       generate_url=None, containers=(), groups={}, nodes=())
        try:
            typed = read_outputs(dict(outputs))
        except OutputsError as error:
            raise StackError(f"stack {stack}: {error}") from None
        door = Door.from_output(typed.door) if typed.door is not None else None
        slot_of = {slot.role: slot.name for slot in door.slots} if door else {}
        rank_of = {rank_role(name, rank): (name, rank)
                   for name, group in typed.groups.items() for rank in range(len(group.nodes))}
        refs = []
        for role, entry in (typed.containers or {}).items():
            group, rank = rank_of.get(role, (None, None))
            refs.append(ContainerRef(role=role, node=entry.node, name=entry.container,
                                     health_url=entry.health_url, group=group, rank=rank,
                                     slot=slot_of.get(role)))
        mode_order = {"prefill": 1, "decode": 2}

        def order(ref: ContainerRef) -> tuple:
            if ref.role == MOONCAKE_MASTER:
                return (0, "", 0, ref.role)
            if ref.group is not None:
                return (mode_order[typed.groups[ref.group].mode], ref.group, ref.rank, ref.role)
            # The door (each door, on two door nodes) first, then the routers behind it.
            if ref.role == DOOR or ref.role.startswith(DOOR + "-"):
                return (4, "", 0, ref.role)
            return (4 if ref.is_router else 5, "", 1, ref.role)

        nodes = list(typed.nodes)
        nodes += [ref.node for ref in refs if ref.node not in nodes]
        return cls(
            stack=stack,
            serving=typed.serving,
            restart_generation=typed.restart_generation,
            router_url=typed.router_url,
            generate_url=typed.generate_url,
            containers=tuple(sorted(refs, key=order)),
            groups=dict(typed.groups),
            nodes=tuple(sorted(dict.fromkeys(nodes), key=address_key)),
            firewall_table=typed.firewall.table if typed.firewall.enabled else None,
            door=door,
        )

    @property
    def routers(self) -> list[ContainerRef]:
        """The router, or the door's slots (each a router)."""
        return [ref for ref in self.containers if ref.is_router]

    @property
    def router(self) -> ContainerRef | None:
        """The router, or the first of the door's slots (they share the router's node)."""
        return next(iter(self.routers), None)

    @property
    def door_container(self) -> ContainerRef | None:
        return next((ref for ref in self.containers if ref.role == DOOR), None)

    def select(self, selectors: Iterable[str]) -> list[ContainerRef]:
        """Containers matching any selector: a role (`decode-r1`, `door`, `router-a`), a role
        prefix (`decode`, `mooncake`, `router`: the router or both of the door's slots), a group
        name or a group mode (`prefill`, `decode`)."""
        wanted = [s for s in selectors if s]
        if not wanted:
            return list(self.containers)
        chosen = []
        for ref in self.containers:
            group = self.groups.get(ref.group) if ref.group is not None else None
            mode = group.mode if group is not None else None
            if any(ref.role.startswith(s) or s in (ref.group, mode) for s in wanted):
                chosen.append(ref)
        return chosen


def address_key(address: str) -> tuple:
    parts = address.split(".")
    return tuple(int(p) if p.isdigit() else p for p in parts) if len(parts) == 4 else (address,)
