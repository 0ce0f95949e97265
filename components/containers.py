"""One docker container on one node, with the settings every kimipd container shares."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_docker as docker

from .config import ClusterConfig
from .node import Node
from .render import container_labels, container_mounts, container_name, env_list


def node_container(cfg: ClusterConfig, role: str, node: Node, command: list[str],
                   env: dict[str, str], *, gpu_workload: bool,
                   depends_on: Sequence[pulumi.Resource], parent: pulumi.Resource) -> docker.Container:
    """Host network and host IPC (NCCL, RDMA and the KV bootstrap bind the node's addresses)."""
    settings = cfg.container
    return docker.Container(
        role,
        name=container_name(role),
        image=node.image_id,
        command=command,
        envs=env_list(env),
        labels=[docker.ContainerLabelArgs(label=k, value=v)
                for k, v in container_labels(cfg, role).items()],
        network_mode="host",
        ipc_mode="host",
        # `no` unless the operator says otherwise: a lone restarted rank cannot rejoin its NCCL
        # group, so a crash must surface (gate, status) instead of looping.
        restart=settings.restart,
        gpus=settings.gpus if gpu_workload else None,
        devices=[docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions="rwm")
                 for d in settings.devices] if gpu_workload else None,
        capabilities=docker.ContainerCapabilitiesArgs(adds=settings.capabilities)
        if gpu_workload and settings.capabilities else None,
        privileged=settings.privileged,
        shm_size=settings.shm_size_mb,
        ulimits=[docker.ContainerUlimitArgs(name=k, soft=v, hard=v)
                 for k, v in sorted(settings.ulimits.items())],
        volumes=[docker.ContainerVolumeArgs(host_path=h, container_path=c, read_only=ro)
                 for h, c, ro in container_mounts(cfg)],
        must_run=True,
        opts=pulumi.ResourceOptions(
            parent=parent, provider=node.provider, depends_on=[*node.ready, *depends_on]),
    )
