"""The Mooncake master: its argv, address, health URL and container."""

from __future__ import annotations

from ..config import ClusterConfig
from .container_plan import ContainerPlan, container_plan
from .layout import MOONCAKE_MASTER
from .node_files import launch_wrapper


def mooncake_master_command(cfg: ClusterConfig) -> list[str]:
    master = cfg.mooncake_master
    # Through launch.sh too, so the master runs the same Mooncake as the servers' wheels; it
    # execs the binary inside the package, not the console script (see launch.sh).
    return launch_wrapper(cfg, mooncake_only=True) + [
        "mooncake_master",
        "--rpc_port", str(master.rpc_port),
        "--rpc_address", master.node,
        "--metrics_port", str(master.metrics_port),
        *master.extra_args,
    ]


def mooncake_master_address(cfg: ClusterConfig) -> str:
    return f"{cfg.mooncake_master.node}:{cfg.mooncake_master.rpc_port}"


def mooncake_master_health_url(cfg: ClusterConfig) -> str:
    master = cfg.mooncake_master
    return f"http://{master.node}:{master.metrics_port}/health"


def mooncake_master_env(cfg: ClusterConfig) -> dict[str, str]:
    env = dict(cfg.container.env)
    if cfg.mooncake_master.runtime == "nvidia":
        # Driver libraries (libcuda) mounted, no GPU claimed: the ranks own every GPU.
        env |= {"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    return env


def mooncake_master_plan(cfg: ClusterConfig) -> ContainerPlan:
    return container_plan(cfg, MOONCAKE_MASTER, cfg.mooncake_master.node,
                          mooncake_master_command(cfg), mooncake_master_env(cfg),
                          mooncake_master_health_url(cfg), gpu_workload=False,
                          runtime=cfg.mooncake_master.runtime)
