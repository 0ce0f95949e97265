"""The whole deployment, in the runbook's order: nodes, mc-master -> prefill -> decode -> router."""

from __future__ import annotations

import pulumi

from .config import ClusterConfig
from .door import Door
from .keys import WorkerKeyFile
from .membership import Membership
from .mooncake import MooncakeMaster
from .node import Node
from .outputs import stack_outputs
from .render import (CLUSTER_TYPE, load_bound_seconds, measured_load_seconds, model_fingerprint,
                     router_slots, running_contract)
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
                 admin_api_key: pulumi.Input[str] | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(CLUSTER_TYPE, name, None, opts)
        # SGLang's admin routes' own key (the secret adminApiKey), in each rank's key file.
        self.admin_api_key = admin_api_key
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
        # Every output the config decides (components/outputs.py, the readers' contract), then
        # what the nodes tell: each node's image digest, the smoke test's answer, the key.
        self.typed_outputs = stack_outputs(cfg, node_file_digests, pulumi.get_stack())
        self.contract = self.typed_outputs.serving_contract.digest
        self.outputs: dict[str, object] = self.typed_outputs.exported()
        self.outputs["nodes"] = {
            address: entry | ({"imageDigest": self.nodes[address].image_digest,
                               "preparedImage": self.nodes[address].prepared_image_tag}
                              if address in self.nodes else {})
            for address, entry in self.typed_outputs.exported()["nodes"].items()}
        if cfg.serving:
            self._serve(cfg, child, router_api_key, door_tls_key)
        self.register_outputs({})

    def _declared_contract(self, cfg: ClusterConfig, group: str) -> pulumi.Output[str]:
        """GROUP's contract as its admission declares it: the config's, the image its rank 0's
        node holds and the checkpoint its rank 0's gate read (render/contract.py)."""
        rank0 = self.nodes[cfg.groups[group].rank0]
        serving = {**self.prefill, **self.decode}[group]
        contract = self.contract
        return pulumi.Output.all(rank0.image_id, serving.gate.checks[0].stdout).apply(
            lambda found: running_contract(contract, found[0], model_fingerprint(found[1])))

    def _load_outputs(self, cfg: ClusterConfig, group: str) -> dict[str, pulumi.Output]:
        """GROUP's last measured load (its rank 0 gate's) and the load bound that follows from it
        where the config sets none (render/sglang.py, load_bound_seconds)."""
        gate_stdout = {**self.prefill, **self.decode}[group].gate.checks[0].stdout
        measured = gate_stdout.apply(measured_load_seconds)
        configured, gate_timeout = cfg.groups[group].load_bound_seconds, cfg.gates.timeout_seconds
        return {"lastLoadSeconds": measured,
                "loadBoundSeconds": measured.apply(
                    lambda seconds: load_bound_seconds(configured, seconds, gate_timeout))}

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
                                                self.admin_api_key, opts=child)
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
                                   after=self.doors[-1] if self.doors else None,
                                   internal_key=router_api_key, opts=child))
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
                Membership(name, cfg, router_node, self.routers, group,
                           self._declared_contract(cfg, name), opts=child)
                for name, group in {**self.prefill, **self.decode}.items()
            ]
            router_gates = [RouterReadiness(cfg, router_node, self.routers, self.memberships,
                                            opts=child)]
        self.smoke_test = SmokeTest(
            cfg, router_node, self.routers,
            [self.mooncake_master.gate, *prefill_gates, *decode_gates, *router_gates,
             *[virtual_ip.gate for virtual_ip in self.virtual_ips]],
            doors=self.doors, opts=child)
        self.outputs["smokeTest"] = self.smoke_test.text
        self.outputs["groups"] = {
            name: entry | self._load_outputs(cfg, name)
            for name, entry in self.typed_outputs.exported()["groups"].items()}
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
