"""Containers: everything docker is told about each one, the same for every kind of process."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ClusterConfig
from .layout import NODE_ASSET_DIR, container_name

# The stack's restart generation on every container: what `kimipd status` compares with the
# stack's output to tell a pending `up` (ops/status.py).
GENERATION_LABEL = "kimipd.restart-generation"


def container_labels(cfg: ClusterConfig, role: str,
                     group_name: str | None = None) -> dict[str, str]:
    # The generations are labels so that bumping one changes an input that forces replacement:
    # the global one on every container, a group's own on that group's ranks.
    labels = {
        "kimipd.role": role,
        GENERATION_LABEL: str(cfg.restart_generation),
    }
    if group_name is not None:
        labels |= {"kimipd.group": group_name,
                   "kimipd.group-restart-generation":
                       str(cfg.groups[group_name].restart_generation)}
    return labels


@dataclass(frozen=True)
class ContainerPlan:
    """One container as docker will run it; the Pulumi component is a thin wrapper around it."""

    role: str
    node: str
    name: str
    command: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    mounts: list[tuple[str, str, bool]]  # (host path, container path, read-only)
    gpus: str | None
    devices: list[str]
    capabilities: list[str]
    privileged: bool
    shm_size_mb: int
    ulimits: dict[str, int]
    restart: str
    runtime: str | None  # docker's --runtime; None: the engine's default
    health_url: str  # what its gate polls on its node
    entrypoint: list[str] | None = None  # None: the image's own
    stop_signal: str | None = None  # None: docker's SIGTERM
    user: str | None = None  # None: the image's own


def container_plan(cfg: ClusterConfig, role: str, node: str, command: list[str],
                   env: dict[str, str], health: str, gpu_workload: bool,
                   runtime: str | None = None, group_name: str | None = None) -> ContainerPlan:
    settings = cfg.container
    return ContainerPlan(
        role=role,
        node=node,
        name=container_name(role),
        command=command,
        env=env,
        labels=container_labels(cfg, role, group_name),
        mounts=container_mounts(cfg),
        gpus=settings.gpus if gpu_workload else None,
        devices=list(settings.devices) if gpu_workload else [],
        capabilities=list(settings.capabilities) if gpu_workload else [],
        privileged=settings.privileged,
        shm_size_mb=settings.shm_size_mb,
        ulimits=dict(sorted(settings.ulimits.items())),
        # `no` unless the operator says otherwise: a lone restarted rank cannot rejoin its NCCL
        # group, so a crash must surface (gate, refresh) instead of looping.
        restart=settings.restart,
        runtime=runtime,
        health_url=health,
    )


def container_mounts(cfg: ClusterConfig) -> list[tuple[str, str, bool]]:
    """The program's scripts, the node files (at their node paths) and the operator's volumes."""
    mounts = [(NODE_ASSET_DIR, NODE_ASSET_DIR, True)]
    mounts += [(f.destination, f.destination, True) for f in cfg.node_files]
    mounts += [(v.host_path, v.container_path, v.read_only) for v in cfg.container.volumes]
    return mounts


def env_list(env: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in sorted(env.items())]
