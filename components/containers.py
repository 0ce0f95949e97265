"""One docker container on one node, exactly as its ContainerPlan says."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_docker as docker

from .node import Node
from .render import ContainerPlan, env_list


def docker_capabilities(names: Sequence[str]) -> list[str]:
    """capabilities(7) names as docker reports them back (CAP_IPC_LOCK): the provider's refresh
    reads them so, and a name without CAP_ would be a diff after every refresh, replacing the
    container at the next `up` (every rank and both keepalived at once, at each heal)."""
    return [name if name.startswith("CAP_") else "CAP_" + name for name in names]


def node_container(plan: ContainerPlan, node: Node, *, depends_on: Sequence[pulumi.Resource],
                   parent: pulumi.Resource, follows: docker.Container | None = None,
                   resource_name: str | None = None,
                   aliases: Sequence[pulumi.Alias] = (),
                   extra_labels: Mapping[str, pulumi.Input[str]] | None = None,
                   image: pulumi.Input[str] | None = None,
                   stop_grace_seconds: int | None = None) -> docker.Container:
    """Host network and host IPC: NCCL, RDMA and the KV bootstrap bind the node's addresses.

    A container found stopped (`refresh` records `mustRun` drift) is replaced, not restarted in
    place: a new id re-runs its gate and the smoke test, so `up` never reports a cluster that
    was merely started as converged. follows (ranks >= 1: rank 0): its id is a label, so whatever
    replaces rank 0 replaces this rank too (deleted before rank 0 goes, created after it), because
    a lone restarted rank cannot rejoin its NCCL group.
    """
    return docker.Container(
        resource_name or plan.role,
        name=plan.name,
        image=node.run_image_id if image is None else image,
        command=plan.command,
        entrypoints=plan.entrypoint,
        stop_signal=plan.stop_signal,
        user=plan.user,
        envs=env_list(plan.env),
        labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in plan.labels.items()]
        + ([docker.ContainerLabelArgs(label="kimipd.rank0-container", value=follows.id)]
           if follows is not None else [])
        + [docker.ContainerLabelArgs(label=k, value=v) for k, v in (extra_labels or {}).items()],
        network_mode="host",
        ipc_mode="host",
        restart=plan.restart,
        runtime=plan.runtime,
        gpus=plan.gpus,
        devices=[docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions="rwm")
                 for d in plan.devices] or None,
        capabilities=docker.ContainerCapabilitiesArgs(adds=docker_capabilities(plan.capabilities))
        if plan.capabilities else None,
        privileged=plan.privileged,
        shm_size=plan.shm_size_mb,
        ulimits=[docker.ContainerUlimitArgs(name=k, soft=v, hard=v)
                 for k, v in plan.ulimits.items()],
        volumes=[docker.ContainerVolumeArgs(host_path=h, container_path=c, read_only=ro)
                 for h, c, ro in plan.mounts],
        must_run=True,
        # Set: removed with SIGTERM and this long to finish (the rust router's in-flight
        # requests); unset: `docker rm -f` at once.
        destroy_grace_seconds=stop_grace_seconds,
        opts=pulumi.ResourceOptions(
            parent=parent, provider=node.provider, depends_on=[*node.ready, *depends_on],
            replace_on_changes=["mustRun"], aliases=list(aliases) or None,
            # Fixed container names and host-network ports: a replacement cannot start beside
            # the container it replaces, so the old one goes first, for every role.
            delete_before_replace=True),
    )
