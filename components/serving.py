"""A multi-node SGLang server: every rank of one prefill or decode group, and its gate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_docker as docker

from .config import ClusterConfig
from .containers import node_container
from .gates import BootstrapGate, HealthGate
from .keys import WorkerKeyFile
from .node import Node
from .render import ContainerPlan, group_endpoint, sglang_rank_plan


class ServingGroup(pulumi.ComponentResource):
    """One container per rank; ready when rank 0 answers /health and every other rank its dummy
    /health (SGLang starts it once that rank has loaded its model)."""

    endpoint: pulumi.Output[str]

    def __init__(self, name: str, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 wait_for: Sequence[pulumi.Resource], bootstrap_gate: bool = False,
                 key_files: Mapping[str, WorkerKeyFile] | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:serving:ServingGroup", name, None, opts)
        group = cfg.groups[name]
        plans = [sglang_rank_plan(cfg, name, rank) for rank in range(len(group.nodes))]

        def rank_container(plan: ContainerPlan, **options) -> docker.Container:
            key_file = key_files[plan.node].file if key_files else None
            # Named by where it runs (a node holds one rank per mode), not by group and rank:
            # regrouping nodes (1P1D -> 2P2D) then replaces each node's container in place, in
            # dependency order and old one first, instead of creating the new group beside the
            # old one's ports and GPUs and deleting the old at the end. The alias carries stacks
            # deployed when containers were named by role.
            # The key file's id as a label: a new key restarts the rank with it (and the rank
            # waits for the file: no depends_on repeats it).
            return node_container(plan, nodes[plan.node], depends_on=wait_for,
                                  parent=self,
                                  resource_name=f"{nodes[plan.node].resource_name}-{group.mode}",
                                  aliases=[pulumi.Alias(name=plan.role)],
                                  extra_labels={"kimipd.api-key-file": key_file.id}
                                  if key_file else None, **options)

        rank0 = rank_container(plans[0])
        # When a rank dies its group dies (NCCL abort, then rank 0's watchdog); whatever replaces
        # rank 0 replaces every rank, so the group restarts whole and is gated again.
        self.containers = [rank0] + [rank_container(plan, follows=rank0) for plan in plans[1:]]
        # Rank 0's check also reads the checkpoint the group loaded (its admission's contract).
        self.gate = HealthGate(f"{name}-ready", cfg, nodes, plans, self.containers,
                               opts=pulumi.ResourceOptions(parent=self), fingerprint=True)
        # A prefill group's rank 0 bootstrap server answering: what decode waits for when the
        # cluster starts overlapped (see Cluster).
        self.bootstrap_gate = BootstrapGate(
            f"{name}-bootstrap", cfg, name, nodes, self.containers,
            opts=pulumi.ResourceOptions(parent=self)) if bootstrap_gate else None
        self.endpoint = pulumi.Output.from_input(group_endpoint(group))
        self.register_outputs({"endpoint": self.endpoint})
