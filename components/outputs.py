"""The stack's outputs as a typed contract: what the program exports and what everything that
reads them (ops/, the observability project, the benches, the review tool, the tests) validates
with `StackOutputs.model_validate`, and nothing else.

`stack_outputs` builds them from the typed config alone (plain data: no secret, nothing the engine
knows only after an `up`); `Cluster` adds the few values it learns on the nodes (each node's image
digest, the smoke test's answer) and the router's key as a secret, and exports every field under
its camelCase name. A change of shape bumps OUTPUTS_VERSION; a reader refuses a version it does
not know, with the command that brings the stack to this one."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from .config import ClusterConfig
from .render import (
    contract_digest,
    door_admin_socket,
    door_check_file,
    door_plan,
    door_url,
    firewall_table,
    group_endpoint,
    health_seconds,
    keepalived_plan,
    keepalived_state_file,
    mooncake_master_address,
    mooncake_master_plan,
    prometheus_targets,
    restore_command,
    router_plan,
    router_slots,
    router_url,
    serving_contract,
    sglang_rank_plan,
    slot_check_url,
    slot_role,
    slot_server,
    slot_url,
)
from .config.router_schema import PROGRAM_CLIENT
from .render.door import CLIENTS_TABLE
from .render.keepalived import virtual_ip_interface
from .render.layout import router_state_dir
from .render.sglang import SGLANG_HEALTH_CHECK_TIMEOUT_DEFAULT, SGLANG_HEALTH_SLEEP_SECONDS

# The outputs' shape; bump it with any change a reader must know of.
OUTPUTS_VERSION = 1


class OutputsError(ValueError):
    """Outputs that are not this program's: another version, or a shape the models refuse."""


class _Output(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel,
                              populate_by_name=True)


class ServingContract(_Output):
    """What prefill and decode must share (components/render/contract.py), and its digest."""

    digest: str
    image: str
    node_files: dict[str, str]
    model: dict[str, str | None]
    kv: dict[str, str | list[str]]


class GroupOutput(_Output):
    mode: Literal["prefill", "decode"]
    endpoint: str  # rank 0's API, http://NODE:PORT
    bootstrap_port: int | None = None
    nodes: list[str]
    # How long rank 0's /health may take and still be healthy, as SGLang judges it
    # (render/sglang.py, health_seconds): SGLang's own default, where an older `up` exported none.
    health_seconds: float = SGLANG_HEALTH_SLEEP_SECONDS + SGLANG_HEALTH_CHECK_TIMEOUT_DEFAULT
    # How long it may load before a running group that does not serve is hung (groups[].
    # loadBoundSeconds, else from its last measured load, else gates.timeoutSeconds: render/
    # sglang.py, load_bound_seconds); None where an older `up` exported none.
    load_bound_seconds: float | None = None
    # How long rank 0 took to serve at its last start, as its gate measured it; None before a
    # gate passed (and with `serving: false`).
    last_load_seconds: float | None = None


class NodeOutput(_Output):
    roles: list[str]
    # Learned on the node by an `up` (Cluster adds them); none for a node out.
    image_digest: str | None = None
    prepared_image: str | None = None
    out: bool = False


class FirewallOutput(_Output):
    enabled: bool
    table: str  # `inet kimipd_PORT`
    members: list[str]
    client_networks: list[str]
    monitoring_hosts: list[str]
    operator_hosts: list[str]


class ContainerOutput(_Output):
    """One container: where it runs and what its gate polls (its role is its key)."""

    node: str
    container: str
    health_url: str


class SlotOutput(_Output):
    url: str  # the slot's own port on its node
    port: int
    metrics_port: int | None = None
    role: str  # router-a
    container: str
    server: str  # its server in the door's backend (the runtime API's name)
    # What reconcile runs on router.node to give the slot back its groups (rust routers).
    restore: str | None = None
    # Where it runs, with the door on two nodes.
    node: str | None = None
    # What the door asks of it (rust routers: its pair check beside the router).
    check_url: str | None = None


class KeepalivedOutput(_Output):
    role: str
    container: str
    state_file: str  # where keepalived's notify reader writes the instance's state


class DoorNodeOutput(_Output):
    role: str  # door on router.node, door-A-B-C-D on the other
    container: str
    metrics_url: str
    admin_socket: str
    keepalived: KeepalivedOutput
    peer: str | None = None  # the other door node (none while it is out)


class VirtualIpOutput(_Output):
    address: str
    prefix_length: int
    interface: str
    vrid: int
    advert_interval_ms: int
    check_file: str


class DoorOutput(_Output):
    """HAProxy on router.port in front of two router slots (on two door nodes: one door on each,
    and the virtual IP between them; `node` stays router.node)."""

    url: str
    tls: bool
    node: str
    metrics_url: str
    admin_socket: str
    container: str
    slots: dict[str, SlotOutput]
    nodes: dict[str, DoorNodeOutput] | None = None
    nodes_out: list[str] | None = None
    virtual_ip: VirtualIpOutput | None = None
    # On `node`: the rollout's record (rollout.json) and the router's state (rust router).
    state_dir: str | None = None
    # With router.door.clientKeys: the stick table counting each client's requests
    # (`show table NAME` in each door's runtime API) and the names the door knows.
    clients_table: str | None = None
    clients: list[str] | None = None


class StackOutputs(_Output):
    version: int = Field(default=OUTPUTS_VERSION)
    serving_contract: ServingContract
    mooncake_master: str
    serving: bool
    restart_generation: int
    groups: dict[str, GroupOutput]
    nodes: dict[str, NodeOutput]
    node_files: dict[str, str]
    verification: dict[str, Any]
    firewall: FirewallOutput
    # With `serving` only.
    containers: dict[str, ContainerOutput] | None = None
    router_url: str | None = None
    generate_url: str | None = None
    smoke_test: str | None = None
    prometheus_targets: list[dict[str, Any]] | None = None
    door: DoorOutput | None = None
    # A secret: `[secret]` (or absent) wherever secrets are not shown.
    router_api_key: str | None = None

    def exported(self) -> dict[str, Any]:
        """The outputs as the program exports them: camelCase, the unset ones left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def read_outputs(outputs: dict[str, Any]) -> StackOutputs:
    """A stack's outputs as its readers take them, or an OutputsError saying what to do."""
    if not outputs:
        raise OutputsError("the stack has no outputs: it was never deployed, or was destroyed "
                           "(`pulumi up` it first)")
    version = outputs.get("version")
    if version != OUTPUTS_VERSION:
        raise OutputsError(
            f"the stack's outputs are of version {version!r}, and this checkout reads version "
            f"{OUTPUTS_VERSION}: a kimipd of another version deployed it; `pulumi up` it with this "
            "checkout (or use the checkout that deployed it)")
    try:
        return StackOutputs.model_validate(outputs)
    except ValidationError as error:
        raise OutputsError(f"the stack's outputs do not match version {OUTPUTS_VERSION}'s "
                           f"model: {error}") from None


def stack_outputs(cfg: ClusterConfig, node_file_digests: dict[str, str],
                  stack: str) -> StackOutputs:
    """Every output the typed config decides, for stack STACK (a config already taken through
    `in_service`: the nodes out are marked, not served)."""
    contract = serving_contract(cfg, node_file_digests)
    nodes = {node.address: NodeOutput(roles=cfg.roles_of(node.address))
             for node in cfg.nodes if not node.out}
    nodes |= {address: NodeOutput(roles=[], out=True) for address in cfg.out_nodes}
    outputs = StackOutputs(
        serving_contract=ServingContract.model_validate(
            {"digest": contract_digest(contract), **contract}),
        mooncake_master=mooncake_master_address(cfg),
        serving=cfg.serving,
        restart_generation=cfg.restart_generation,
        groups={name: GroupOutput(mode=group.mode, endpoint=group_endpoint(group),
                                  bootstrap_port=group.bootstrap_port, nodes=list(group.nodes),
                                  health_seconds=health_seconds(cfg, name),
                                  load_bound_seconds=(group.load_bound_seconds
                                                      or cfg.gates.timeout_seconds))
                for name, group in cfg.groups.items()},
        nodes=nodes,
        node_files=dict(sorted(node_file_digests.items())),
        verification=cfg.verification.model_dump(by_alias=True, mode="json"),
        firewall=firewall_output(cfg),
    )
    if not cfg.serving:
        return outputs
    return outputs.model_copy(update={
        "containers": container_outputs(cfg),
        "router_url": router_url(cfg),
        "generate_url": router_url(cfg) + "/generate",
        "prometheus_targets": prometheus_targets(cfg, stack),
        "door": door_output(cfg),
    })


def firewall_output(cfg: ClusterConfig) -> FirewallOutput:
    """Who the nodes' firewalls let in (the observability project checks its Prometheus node
    against it)."""
    spec = cfg.firewall
    return FirewallOutput(enabled=spec.enabled, table=f"inet {firewall_table(cfg)}",
                          members=[node.address for node in cfg.nodes],
                          client_networks=list(spec.client_networks),
                          monitoring_hosts=list(spec.monitoring_hosts),
                          operator_hosts=list(spec.operator_hosts))


def door_output(cfg: ClusterConfig) -> DoorOutput | None:
    """Where the door and its slots are (kimipd status, logs and the bench read it). On two door
    nodes also where each slot runs, each door node's door and keepalived, the virtual IP between
    them (`node` stays router.node: the slot lease and the markers), and the door node taken out,
    if one is (`nodesOut`: nothing of it is asked)."""
    door = cfg.router.door
    if door is None:
        return None
    node = cfg.router.node
    vip = door.virtual_ip if door.nodes is not None else None
    slots = {
        name: SlotOutput(url=slot_url(cfg, name), port=slot.port, metrics_port=slot.metrics_port,
                         role=slot_role(name), container=router_plan(cfg, name).name,
                         server=slot_server(name),
                         # The slot's own first step, which honours the rollout's markers.
                         restore=restore_command(cfg, name) if cfg.router.kind == "rust" else None,
                         node=cfg.slot_node(name) if vip is not None else None,
                         check_url=(slot_check_url(cfg, name) if cfg.router.kind == "rust"
                                    else None))
        for name, slot in door.slot_named().items()}
    output = DoorOutput(url=door_url(cfg), tls=door.tls is not None, node=node,
                        metrics_url=f"http://{node}:{door.metrics_port}/metrics",
                        admin_socket=door_admin_socket(cfg), container=door_plan(cfg).name,
                        slots=slots,
                        state_dir=router_state_dir(cfg) if cfg.router.kind == "rust" else None,
                        clients_table=CLIENTS_TABLE if door.client_keys else None,
                        clients=([PROGRAM_CLIENT, *door.client_keys] if door.client_keys
                                 else None))
    if vip is None:
        return output
    nodes = {
        address: DoorNodeOutput(
            role=door_plan(cfg, address).role, container=door_plan(cfg, address).name,
            metrics_url=f"http://{address}:{door.metrics_port}/metrics",
            admin_socket=door_admin_socket(cfg),
            keepalived=KeepalivedOutput(role=keepalived_plan(cfg, address).role,
                                        container=keepalived_plan(cfg, address).name,
                                        state_file=keepalived_state_file(cfg)),
            peer=cfg.door_peer(address))
        for address in cfg.door_nodes}
    return output.model_copy(update={
        "nodes": nodes,
        # A door node taken out: the other carries the address alone.
        "nodes_out": [address for address in door.nodes or [] if address in cfg.out_nodes],
        "virtual_ip": VirtualIpOutput(address=vip.address, prefix_length=vip.prefix_length,
                                      interface=virtual_ip_interface(cfg), vrid=vip.vrid,
                                      advert_interval_ms=vip.advert_interval_ms,
                                      check_file=door_check_file(cfg)),
    })


def container_outputs(cfg: ClusterConfig) -> dict[str, ContainerOutput]:
    """Every container by role: where it runs and what its gate polls."""
    plans = [mooncake_master_plan(cfg)]
    for name, group in cfg.groups.items():
        plans += [sglang_rank_plan(cfg, name, rank) for rank in range(len(group.nodes))]
    plans += [door_plan(cfg, address) for address in cfg.door_nodes]
    plans += [router_plan(cfg, slot) for slot in router_slots(cfg)]
    plans += [keepalived_plan(cfg, address) for address in cfg.virtual_ip_nodes]
    return {plan.role: ContainerOutput(node=plan.node, container=plan.name,
                                       health_url=plan.health_url)
            for plan in plans}
