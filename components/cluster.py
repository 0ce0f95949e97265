"""The whole deployment, in the runbook's order: nodes, mc-master -> prefill -> decode -> router."""

from __future__ import annotations

import pulumi

from .config import ClusterConfig
from .door import Door
from .keys import WorkerKeyFile
from .membership import Membership
from .mooncake import MooncakeMaster
from .node import Node
from .render import (
    CLUSTER_TYPE,
    contract_digest,
    door_admin_socket,
    door_check_file,
    door_plan,
    door_url,
    firewall_table,
    group_endpoint,
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
    slot_role,
    slot_server,
    slot_url,
)
from .render.keepalived import virtual_ip_interface
from .router import Router
from .router_api_key import RouterApiKey
from .router_readiness import RouterReadiness
from .serving import ServingGroup
from .smoke_test import SmokeTest
from .virtual_ip import VirtualIp


class Cluster(pulumi.ComponentResource):
    """Every node prepared; with `serving`, every container started in order and smoke-tested."""

    def __init__(self, name: str, cfg: ClusterConfig, private_key: pulumi.Input[str] | None,
                 node_file_digests: dict[str, str], host_keys: dict[str, str | None],
                 router_api_key: pulumi.Input[str] | None = None,
                 door_tls_key: pulumi.Input[str] | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(CLUSTER_TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # A node taken out (`nodes[].out`) gets no resource and its groups none: nothing here
        # dials it. `scripts/kimipd up` drops what the state still holds of it (ops/node_out.py).
        cfg = cfg.in_service()
        self.nodes = {node.address: Node(cfg, node, private_key, host_keys[node.address],
                                         opts=child)
                      for node in cfg.nodes if not node.out}
        if cfg.install_node_files == "image":
            for node in self.nodes.values():
                node.prepare_image(cfg, node_file_digests)
        contract = serving_contract(cfg, node_file_digests)
        self.contract = contract_digest(contract)
        self.outputs: dict[str, object] = {
            # What prefill and decode must share, and its digest (the router's node keeps one
            # per router): a change of it rolls in halves (docs/router.md); plain data.
            "servingContract": {"digest": self.contract, **contract},
            "mooncakeMaster": mooncake_master_address(cfg),
            "serving": cfg.serving,
            "restartGeneration": cfg.restart_generation,
            "groups": {
                group_name: {
                    "mode": group.mode,
                    "endpoint": group_endpoint(group),
                    "bootstrapPort": group.bootstrap_port,
                    "nodes": list(group.nodes),
                }
                for group_name, group in cfg.groups.items()
            },
            "nodes": {
                address: {"roles": cfg.roles_of(address), "imageDigest": node.image_digest,
                          "preparedImage": node.prepared_image_tag}
                for address, node in self.nodes.items()
            } | {address: {"roles": [], "out": True} for address in cfg.out_nodes},
            "nodeFiles": dict(sorted(node_file_digests.items())),
            # The observability project (observability/) derives its time-to-first-token alert
            # from this baseline; plain data, no secret in it.
            "verification": cfg.verification.model_dump(by_alias=True, mode="json"),
            # Who the nodes' firewalls let in (the observability project checks its Prometheus
            # node against it); plain data, no secret in it.
            "firewall": firewall_output(cfg),
        }
        if cfg.serving:
            self._serve(cfg, child, router_api_key, door_tls_key)
        self.register_outputs({})

    def _serve(self, cfg: ClusterConfig, child: pulumi.ResourceOptions,
               router_api_key: pulumi.Input[str] | None,
               door_tls_key: pulumi.Input[str] | None) -> None:
        # Nothing starts until every node is prepared (runbook steps 1-4 before 5): a node that
        # fails preflight leaves the cluster without a single container.
        every_node_ready = [resource for node in self.nodes.values() for resource in node.ready]
        # Runbook rule 2: prefill registers its bootstrap server before decode starts; stop
        # order is the reverse, which Pulumi derives from these same edges on destroy.
        self.mooncake_master = MooncakeMaster(cfg, self.nodes, wait_for=every_node_ready,
                                              opts=child)
        overlapped = cfg.start_order == "overlapped"
        # With the rust router every server requires its key (the router registers each group
        # with it and forwards the client's); MiniLB forwards none, so its servers have none.
        key_files = None
        if cfg.workers_keyed and router_api_key is not None:
            rank_nodes = sorted({address for group in cfg.groups.values()
                                 for address in group.nodes})
            key_files = {address: WorkerKeyFile(cfg, self.nodes[address], router_api_key,
                                                opts=child)
                         for address in rank_nodes}
        self.prefill = {
            name: ServingGroup(name, cfg, self.nodes, wait_for=[self.mooncake_master.gate],
                               bootstrap_gate=overlapped, key_files=key_files, opts=child)
            for name in cfg.groups_in_mode("prefill")
        }
        prefill_gates = [group.gate for group in self.prefill.values()]
        # sequential: decode starts once prefill is healthy (P + D model loads, as the runbook
        # ran). overlapped: once every prefill rank 0's bootstrap server answers, which SGLang
        # opens before the model loads; decode's start never dials prefill (max(P, D)).
        # Each decode group waits for its own half of the prefill groups (`paired_prefill`),
        # not all of them: a change of contract then rolls a prefill and a decode group to the
        # new one while the others serve the old one (a decode waiting for every new prefill
        # would wait for the last prefill, which waits for a new decode to serve beside).
        decode_names = list(cfg.groups_in_mode("decode"))
        pairs = paired_prefill(list(self.prefill), decode_names)
        self.decode = {}
        for name in decode_names:
            partners = [self.prefill[partner] for partner in pairs[name]]
            waits_for: list[pulumi.Resource] = (
                [group.bootstrap_gate for group in partners if group.bootstrap_gate is not None]
                if overlapped else [group.gate for group in partners])
            self.decode[name] = ServingGroup(name, cfg, self.nodes, wait_for=waits_for,
                                             key_files=key_files, opts=child)
        decode_gates = [group.gate for group in self.decode.values()]
        router_node = self.nodes[cfg.router.node]
        # With the door: HAProxy on router.port first (on each door node), then its two slots,
        # each a router of its own; they roll one at a time through the slot lease
        # (Router._behind_doors).
        # One door node at a time: a new door image serves on the first before the second's
        # bridge starts.
        self.doors: list[Door] = []
        for address in cfg.door_nodes:
            self.doors.append(Door(cfg, self.nodes, address, door_tls_key,
                                   after=self.doors[-1] if self.doors else None, opts=child))
        # On two door nodes: the address clients use, held by one of them (keepalived).
        door = cfg.router.door
        self.virtual_ips: list[VirtualIp] = []
        if door is not None and door.virtual_ip is not None:
            for each in self.doors:
                self.virtual_ips.append(VirtualIp(
                    cfg, self.nodes, each,
                    after=self.virtual_ips[-1] if self.virtual_ips else None, opts=child))
        # Every node a router runs on reads the key from its own file.
        slot_nodes = {slot: cfg.router.node if slot is None else cfg.slot_node(slot)
                      for slot in router_slots(cfg)}
        api_keys = ({address: RouterApiKey(cfg, self.nodes[address], router_api_key, opts=child)
                     for address in dict.fromkeys(slot_nodes.values())}
                    if cfg.router.kind == "rust" and router_api_key is not None else {})
        if cfg.router.kind == "mini-lb":
            # Its worker list is fixed at start: every group healthy, whatever the start order.
            router_waits_for = [*prefill_gates, *decode_gates]
        else:
            # Up with the nodes; each group joins it through its Membership once its own gate
            # passes, and leaves it (drained) before its containers are replaced.
            router_waits_for = every_node_ready
        self.routers = [Router(cfg, self.nodes, wait_for=router_waits_for,
                               api_key=api_keys.get(slot_nodes[slot]), slot=slot,
                               doors=self.doors, opts=child)
                        for slot in router_slots(cfg)]
        router_gates: list[RouterReadiness] = []
        if cfg.router.kind == "rust":
            self.memberships = [
                Membership(name, cfg, router_node, self.routers, group, self.contract,
                           opts=child)
                for name, group in {**self.prefill, **self.decode}.items()
            ]
            router_gates = [RouterReadiness(cfg, router_node, self.routers, self.memberships,
                                            opts=child)]
        self.smoke_test = SmokeTest(
            cfg, router_node, self.routers,
            [self.mooncake_master.gate, *prefill_gates, *decode_gates, *router_gates,
             *[virtual_ip.gate for virtual_ip in self.virtual_ips]],
            doors=self.doors, opts=child)
        self.outputs |= {
            "containers": container_outputs(cfg),
            "routerUrl": router_url(cfg),
            "generateUrl": router_url(cfg) + "/generate",
            "smokeTest": self.smoke_test.text,
            "prometheusTargets": prometheus_targets(cfg, pulumi.get_stack()),
        }
        if cfg.router.door is not None:
            self.outputs["door"] = door_output(cfg)
        if router_api_key is not None:
            # What clients send as `Authorization: Bearer KEY` (docs/router.md); encrypted in the
            # state.
            self.outputs["routerApiKey"] = pulumi.Output.secret(router_api_key)


def paired_prefill(prefill: list[str], decode: list[str]) -> dict[str, list[str]]:
    """decode group -> the prefill groups it waits for: the i-th decode the prefill groups j
    with j % len(DECODE) == i (more prefill than decode), else the (i % len(PREFILL))-th. Each
    decode waits for at least one prefill (runbook rule 2) and each prefill is waited for."""
    if not prefill:
        return {name: [] for name in decode}
    if len(prefill) >= len(decode):
        return {name: [p for j, p in enumerate(prefill) if j % len(decode) == i]
                for i, name in enumerate(decode)}
    return {name: [prefill[i % len(prefill)]] for i, name in enumerate(decode)}


def firewall_output(cfg: ClusterConfig) -> dict[str, object]:
    spec = cfg.firewall
    return {"enabled": spec.enabled, "table": f"inet {firewall_table(cfg)}",
            "members": [node.address for node in cfg.nodes],
            "clientNetworks": list(spec.client_networks),
            "monitoringHosts": list(spec.monitoring_hosts),
            "operatorHosts": list(spec.operator_hosts)}


def door_output(cfg: ClusterConfig) -> dict[str, object] | None:
    """Where the door and its slots are (kimipd status, logs and the bench read it); plain data.
    On two door nodes also where each slot runs, each door node's door and keepalived, the
    virtual IP between them (`node` stays router.node: the slot lease and the markers), and
    the door node taken out, if one is (`nodesOut`: nothing of it is asked)."""
    door = cfg.router.door
    if door is None:
        return None
    node = cfg.router.node
    vip = door.virtual_ip if door.nodes is not None else None
    slots: dict[str, dict[str, object]] = {}
    for name, slot in door.slot_named().items():
        slots[name] = {"url": slot_url(cfg, name), "port": slot.port,
                       "metricsPort": slot.metrics_port, "role": slot_role(name),
                       "container": router_plan(cfg, name).name, "server": slot_server(name)}
        if cfg.router.kind == "rust":
            # What reconcile runs on router.node when the slot serves without a group that
            # serves (the slot's own first step, which honours the rollout's markers).
            slots[name]["restore"] = restore_command(cfg, name)
        if vip is not None:
            slots[name]["node"] = cfg.slot_node(name)
    output: dict[str, object] = {
        "url": door_url(cfg), "tls": door.tls is not None, "node": node,
        "metricsUrl": f"http://{node}:{door.metrics_port}/metrics",
        "adminSocket": door_admin_socket(cfg), "container": door_plan(cfg).name,
        "slots": slots,
    }
    if vip is None:
        return output
    output["nodes"] = {
        address: {"role": door_plan(cfg, address).role, "container": door_plan(cfg, address).name,
                  "metricsUrl": f"http://{address}:{door.metrics_port}/metrics",
                  # adminSocket: that door's runtime API on that node (status, logs).
                  "adminSocket": door_admin_socket(cfg),
                  # stateFile: where status reads keepalived's state on that node.
                  "keepalived": {"role": keepalived_plan(cfg, address).role,
                                 "container": keepalived_plan(cfg, address).name,
                                 "stateFile": keepalived_state_file(cfg)},
                  "peer": cfg.door_peer(address)}
        for address in cfg.door_nodes}
    # A door node taken out (`nodes[].out`): the other carries the address alone.
    output["nodesOut"] = [address for address in door.nodes or [] if address in cfg.out_nodes]
    output["virtualIp"] = {"address": vip.address, "prefixLength": vip.prefix_length,
                           "interface": virtual_ip_interface(cfg), "vrid": vip.vrid,
                           "advertIntervalMs": vip.advert_interval_ms,
                           "checkFile": door_check_file(cfg)}
    return output


def container_outputs(cfg: ClusterConfig) -> dict[str, dict[str, object]]:
    """Every container by role: where it runs and what its gate polls (day-two tools read it)."""
    plans = [mooncake_master_plan(cfg)]
    for name, group in cfg.groups.items():
        plans += [sglang_rank_plan(cfg, name, rank) for rank in range(len(group.nodes))]
    plans += [door_plan(cfg, address) for address in cfg.door_nodes]
    plans += [router_plan(cfg, slot) for slot in router_slots(cfg)]
    plans += [keepalived_plan(cfg, address) for address in cfg.virtual_ip_nodes]
    return {plan.role: {"node": plan.node, "container": plan.name, "healthUrl": plan.health_url}
            for plan in plans}
