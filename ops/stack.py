"""What the operator tools know about a stack: its outputs (the topology) and the connection
settings of its config, read through the pulumi CLI, or from files a test injects."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from components.config import (
    CONFIG_NAMESPACE,
    ConfigError,
    ConnectionSpec,
    NodeSpec,
    VerificationSpec,
    load_cluster_config,
)
from components.config.router_schema import DEFAULT_ROUTER_KIND
from components.render import DOOR, MOONCAKE_MASTER, ROUTER, container_roles, rank_role, slot_role

REPO = Path(__file__).resolve().parent.parent
PULUMI_TIMEOUT_SECONDS = 120

# The door (router.door): HAProxy in front of two router slots, each slot a router of its own,
# named as the renderers name them (DOOR, slot_role).
# The door's backend in haproxy.cfg, where the slots are servers (`show stat`'s pxname).
DOOR_BACKEND = "slots"
_SLOT_ROLE = re.compile(r"router-[a-z]")


class StackError(Exception):
    """The stack cannot be read: no CLI, no such stack, a config the model refuses."""


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
    # This node's door's runtime API (the `door` output's adminSocket where the entry has none).
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

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or (443 if self.tls else 80)

    def slot(self, name: str) -> Slot | None:
        return next((slot for slot in self.slots if slot.name == name), None)

    @classmethod
    def from_output(cls, door: Mapping[str, Any]) -> Door:
        try:
            url = str(door["url"])
            slots = tuple(
                Slot(name=str(name), url=str(entry["url"]),
                     role=str(entry.get("role") or slot_role(str(name))),
                     container=str(entry.get("container") or f"kimipd-{slot_role(str(name))}"),
                     server=str(entry.get("server") or f"slot-{name}"),
                     metrics_port=(int(entry["metricsPort"]) if entry.get("metricsPort")
                                   is not None else None),
                     restore=str(entry["restore"]) if entry.get("restore") else None)
                for name, entry in sorted((door.get("slots") or {}).items()))
            node = str(door.get("node") or urlsplit(url).hostname or "")
            return cls(url=url, tls=bool(door.get("tls", url.startswith("https://"))),
                       node=node,
                       admin_socket=str(door["adminSocket"]),
                       container=str(door.get("container") or f"kimipd-{DOOR}"),
                       slots=slots, metrics_url=door.get("metricsUrl"),
                       backend=str(door.get("backend") or DOOR_BACKEND),
                       nodes=door_nodes(door.get("nodes") or {}, node,
                                        str(door["adminSocket"])),
                       virtual_ip=virtual_ip(door.get("virtualIp")),
                       nodes_out=tuple(str(node) for node in door.get("nodesOut") or ()))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise StackError(f"the stack's `door` output cannot be read ({type(error).__name__}: "
                             f"{error}): {json.dumps(door, default=str)[:300]}") from None


def door_nodes(nodes: Mapping[str, Any], router_node: str,
               admin_socket: str = "") -> tuple[DoorNode, ...]:
    """The `door` output's `nodes` (address -> its door and keepalived), router.node first.
    ADMIN_SOCKET: the door's runtime API where an entry names none of its own."""
    found = []
    for address, entry in nodes.items():
        keepalived = entry.get("keepalived") or {}
        found.append(DoorNode(
            address=str(address), door_role=str(entry["role"]),
            door_container=str(entry["container"]),
            keepalived_role=str(keepalived["role"]),
            keepalived_container=str(keepalived["container"]),
            state_file=str(keepalived["stateFile"]),
            admin_socket=str(entry.get("adminSocket") or admin_socket)))
    return tuple(sorted(found, key=lambda node: (node.address != router_node,
                                                 _address_key(node.address))))


def virtual_ip(entry: Mapping[str, Any] | None) -> VirtualIp | None:
    if not entry:
        return None
    return VirtualIp(address=str(entry["address"]), prefix_length=int(entry["prefixLength"]),
                     interface=str(entry["interface"]), vrid=int(entry["vrid"]))


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
    groups: Mapping[str, Any]
    nodes: tuple[str, ...]
    # `inet kimipd_PORT` when the stack's firewall is on (its `firewall` output), else None.
    firewall_table: str | None = None
    # The `door` output: None for a stack with a single router on router.port.
    door: Door | None = None

    @classmethod
    def from_outputs(cls, stack: str, outputs: Mapping[str, Any]) -> Topology:
        groups = outputs.get("groups") or {}
        door = Door.from_output(outputs["door"]) if outputs.get("door") else None
        slot_of = {slot.role: slot.name for slot in door.slots} if door else {}
        rank_of: dict[str, tuple[str, int]] = {}
        for name, group in groups.items():
            for rank, _ in enumerate(group.get("nodes") or []):
                rank_of[rank_role(name, rank)] = (name, rank)
        refs = []
        for role, entry in (outputs.get("containers") or {}).items():
            group, rank = rank_of.get(role, (None, None))
            slot = slot_of.get(role)
            if slot is None and group is None and _SLOT_ROLE.fullmatch(role):
                slot = role.removeprefix("router-")  # a slot's container without the output
            refs.append(ContainerRef(role=role, node=entry["node"], name=entry["container"],
                                     health_url=entry["healthUrl"], group=group, rank=rank,
                                     slot=slot))
        mode_order = {"prefill": 1, "decode": 2}

        def order(ref: ContainerRef) -> tuple:
            if ref.role == MOONCAKE_MASTER:
                return (0, "", 0, ref.role)
            if ref.group is not None:
                mode = groups[ref.group].get("mode")
                return (mode_order.get(mode, 3), ref.group, ref.rank, ref.role)
            # The door (each door, on two door nodes) first, then the routers behind it.
            if ref.role == DOOR or ref.role.startswith(DOOR + "-"):
                return (4, "", 0, ref.role)
            return (4 if ref.is_router else 5, "", 1, ref.role)

        nodes = list(outputs.get("nodes") or {})
        for ref in refs:
            if ref.node not in nodes:
                nodes.append(ref.node)
        generation = outputs.get("restartGeneration")
        firewall = outputs.get("firewall") or {}
        return cls(
            stack=stack,
            serving=bool(outputs.get("serving", bool(refs))),
            restart_generation=int(generation) if generation is not None else None,
            router_url=outputs.get("routerUrl"),
            generate_url=outputs.get("generateUrl"),
            containers=tuple(sorted(refs, key=order)),
            groups=groups,
            nodes=tuple(sorted(nodes, key=_address_key)),
            firewall_table=firewall.get("table") if firewall.get("enabled") else None,
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
            mode = self.groups.get(ref.group, {}).get("mode") if ref.group else None
            if any(ref.role.startswith(s) or s in (ref.group, mode) for s in wanted):
                chosen.append(ref)
        return chosen


def _address_key(address: str) -> tuple:
    parts = address.split(".")
    return tuple(int(p) if p.isdigit() else p for p in parts) if len(parts) == 4 else (address,)


@dataclass(frozen=True)
class Access:
    """How to reach the nodes: the program's own connection settings."""

    known_hosts_file: str | None
    nodes: Mapping[str, NodeSpec]
    # The `sshPrivateKey` secret, held in memory only (never printed, never an argument).
    private_key: str | None = field(default=None, repr=False)

    def node(self, address: str) -> NodeSpec:
        return self.nodes.get(address) or NodeSpec(address=address)


@dataclass(frozen=True)
class DoorTlsConfig:
    certificate: str | None = None
    ca_certificate: str | None = None


@dataclass(frozen=True)
class Stack:
    topology: Topology
    access: Access
    verification: VerificationSpec
    # Every container role the config defines (components/render/naming.py); none when the
    # config does not validate, and why (`roles_problem`).
    roles: frozenset[str] = frozenset()
    roles_problem: str | None = None
    # The rust router's key (the secret routerApiKey), for requests sent from here.
    router_api_key: str | None = None
    # The config's `serving` (false: nothing is meant to run, even before an `up` applies it).
    serving_config: bool = True
    # router.kind (the schema's default when the config does not say).
    router_kind: str = DEFAULT_ROUTER_KIND
    # router.door.tls of the config, when there is one: what the door's certificate is checked
    # against (the CA is not among the outputs).
    door_tls: DoorTlsConfig | None = None


def router_config(values: Mapping[str, Any]) -> Mapping[str, Any]:
    router = values.get("router")
    return router if isinstance(router, Mapping) else {}


def door_tls_from_config(values: Mapping[str, Any]) -> DoorTlsConfig | None:
    door = router_config(values).get("door")
    tls = door.get("tls") if isinstance(door, Mapping) else None
    if not isinstance(tls, Mapping):
        return None
    certificate, ca = tls.get("certificate"), tls.get("caCertificate")
    return DoorTlsConfig(certificate=certificate if isinstance(certificate, str) else None,
                         ca_certificate=ca if isinstance(ca, str) else None)


def _pulumi_entry(entry: Any) -> bool:
    """An entry of `pulumi config --json`: {"value", "objectValue"?, "secret"}."""
    return (isinstance(entry, Mapping) and "secret" in entry
            and set(entry) <= {"value", "objectValue", "secret"})


def config_values(pulumi_config: Mapping[str, Any]) -> dict[str, Any]:
    """`kimipd:*` values of `pulumi config --json` (or of a plain {key: value} map), namespace
    stripped, secrets left out."""
    prefix = CONFIG_NAMESPACE + ":"
    values = {}
    for key, entry in pulumi_config.items():
        name = key[len(prefix):] if key.startswith(prefix) else key
        if _pulumi_entry(entry):
            if entry["secret"]:
                continue
            if "objectValue" in entry:
                entry = entry["objectValue"]
            else:
                # Structured values set without --path arrive as JSON text.
                try:
                    entry = json.loads(entry.get("value"))
                except (TypeError, json.JSONDecodeError):
                    entry = entry.get("value")
        values[name] = entry
    return values


def secret_keys(pulumi_config: Mapping[str, Any]) -> set[str]:
    prefix = CONFIG_NAMESPACE + ":"
    return {key[len(prefix):] if key.startswith(prefix) else key
            for key, entry in pulumi_config.items() if _pulumi_entry(entry) and entry["secret"]}


def access_from_config(values: Mapping[str, Any], private_key: str | None = None) -> Access:
    try:
        connection = ConnectionSpec.model_validate(values.get("connection") or {})
        nodes = [NodeSpec.model_validate(node) for node in values.get("nodes") or []]
    except ValidationError as error:
        raise StackError(f"kimipd:connection / kimipd:nodes: {error}") from None
    return Access(known_hosts_file=connection.known_hosts_file,
                  nodes={node.address: node for node in nodes}, private_key=private_key)


def roles_from_config(values: Mapping[str, Any]) -> tuple[frozenset[str], str | None]:
    """Every container role the config defines, as the program names them
    (components/render/naming.py), or none and why, when the config does not validate: then no
    container can be judged this stack's."""
    try:
        return container_roles(load_cluster_config(values)), None
    except ConfigError as error:
        return frozenset(), str(error)


def verification_from_config(values: Mapping[str, Any]) -> VerificationSpec:
    try:
        return VerificationSpec.model_validate(values.get("verification") or {})
    except ValidationError as error:
        raise StackError(f"kimipd:verification: {error}") from None


class PulumiCli:
    """`pulumi ... -s STACK` in the project directory; the backend comes from the caller's
    environment (PULUMI_BACKEND_URL, PULUMI_CONFIG_PASSPHRASE) as for any pulumi command."""

    def __init__(self, stack: str | None, cwd: Path) -> None:
        self.stack = stack
        self.cwd = cwd
        self.binary = shutil.which("pulumi")
        if self.binary is None:
            raise StackError("the pulumi CLI is not on PATH: install it, or source the env file "
                             "scripts/install-pulumi writes (~/.cache/kimipd/pulumi/env)")

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [self.binary, *args] + (["-s", self.stack] if self.stack else [])
        try:
            result = subprocess.run(argv, cwd=self.cwd, capture_output=True, text=True,
                                    timeout=PULUMI_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL,
                                    env=os.environ | {"PULUMI_SKIP_UPDATE_CHECK": "1"})
        except subprocess.TimeoutExpired:
            raise StackError(f"`pulumi {args[0]}` did not answer within "
                             f"{PULUMI_TIMEOUT_SECONDS}s") from None
        if check and result.returncode != 0:
            raise StackError(f"`pulumi {' '.join(args[:2])}` failed: "
                             + (result.stderr.strip() or result.stdout.strip())[-2000:])
        return result

    def stack_name(self) -> str:
        if self.stack:
            return self.stack
        return self._run("stack", "--show-name").stdout.strip()

    def outputs(self) -> dict[str, Any]:
        return json.loads(self._run("stack", "output", "--json", "--show-secrets=false").stdout
                          or "{}")

    def export(self) -> dict[str, Any]:
        """The state as `pulumi stack export` prints it (secrets stay encrypted)."""
        return json.loads(self._run("stack", "export").stdout or "{}")

    def config(self) -> dict[str, Any]:
        return json.loads(self._run("config", "--json").stdout or "{}")

    def secret(self, key: str) -> str | None:
        """A secret's value, captured from stdout into memory (`pulumi config get` decrypts)."""
        result = self._run("config", "get", key, check=False)
        if result.returncode != 0:
            if re.search(r"not found", result.stderr):
                return None
            raise StackError(f"`pulumi config get {key}` failed: {result.stderr.strip()[-2000:]}")
        return result.stdout


def load_stack(stack: str | None, cwd: Path = REPO, outputs_file: Path | None = None,
               config_file: Path | None = None) -> Stack:
    """The stack's outputs and connection settings; files replace the CLI (tests)."""
    name = stack or "injected"
    outputs = json.loads(Path(outputs_file).read_text()) if outputs_file is not None else None
    raw_config = json.loads(Path(config_file).read_text()) if config_file is not None else None
    private_key = router_key = None
    if outputs is None or raw_config is None:
        cli = PulumiCli(stack, cwd)
        name = cli.stack_name()
        if outputs is None:
            outputs = cli.outputs()
        if raw_config is None:
            raw_config = cli.config()
            if "sshPrivateKey" in secret_keys(raw_config):
                private_key = cli.secret("sshPrivateKey")
            if "routerApiKey" in secret_keys(raw_config):
                router_key = cli.secret("routerApiKey")
                router_key = router_key.strip() if router_key is not None else None
    values = config_values(raw_config)
    roles, roles_problem = roles_from_config(values)
    return Stack(topology=Topology.from_outputs(name, outputs),
                 access=access_from_config(values, private_key),
                 verification=verification_from_config(values),
                 roles=roles,
                 roles_problem=roles_problem,
                 router_api_key=router_key,
                 serving_config=values.get("serving", True) not in (False, "false"),
                 router_kind=str(router_config(values).get("kind") or DEFAULT_ROUTER_KIND),
                 door_tls=door_tls_from_config(values))
