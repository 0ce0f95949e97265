"""Commands run on a node over SSH: preflight, the image's environment check and the gates."""

from __future__ import annotations

from pathlib import PurePosixPath

from ..config import ClusterConfig, ConnectionSpec, GroupSpec
from .container_plan import ContainerPlan, container_mounts
from .layout import MOONCAKE_MASTER, WAIT_HEALTHY_SCRIPT, container_name, rank_role, shell
from .sglang import variables_set_in_every_container


def docker_ssh_opts(cfg: ClusterConfig) -> list[str]:
    """Options for the docker provider's `ssh`: the pinned host keys first, then the operator's."""
    return connection_ssh_opts(cfg.connection)


def connection_ssh_opts(connection: ConnectionSpec) -> list[str]:
    """docker_ssh_opts for one `connection` section (the observability project has its own)."""
    pinned = []
    if connection.known_hosts_file is not None:
        pinned = ["-o", f"UserKnownHostsFile={connection.known_hosts_file}",
                  "-o", "StrictHostKeyChecking=yes"]
    return pinned + list(connection.docker_ssh_opts)


def model_host_path(cfg: ClusterConfig) -> str | None:
    """Where model.path (a path inside the containers) is on the node: through the deepest mount
    that covers it, as docker layers nested mounts. None: no mount covers it (the image may
    carry the model)."""
    model = PurePosixPath(cfg.model.path)
    covering = [(PurePosixPath(host), PurePosixPath(inside))
                for host, inside, _ in container_mounts(cfg)
                if PurePosixPath(inside) == model or PurePosixPath(inside) in model.parents]
    if not covering:
        return None
    host, inside = max(covering, key=lambda mount: len(mount[1].parts))
    return str(host / model.relative_to(inside))


def preflight_command(cfg: ClusterConfig, address: str, script: str) -> str:
    """assets/preflight.sh fed on stdin: it writes nothing to the node, and an edit to it shows
    in the diff and runs it again."""
    node = cfg.node(address)
    check = cfg.preflight
    # Only SGLang ranks load the model and get container.devices (see _plan).
    runs_rank = any(role not in (MOONCAKE_MASTER, *cfg.router_roles)
                    for role in cfg.roles_of(address))
    model = model_host_path(cfg) if check.check_model and runs_rank else None
    devices = cfg.container.devices if check.check_rdma and runs_rank else []
    argv = [
        "bash", "-s", "--",
        "--node", address,
        "--gpus", str(node.gpus if check.check_gpus else 0),
        "--max-gpu-memory-used-mib", str(check.max_gpu_memory_used_mib),
        "--rdma-devices", ",".join(cfg.network.rdma_devices) if check.check_rdma else "",
        "--compute-interface", cfg.network.compute_interface,
        "--nvidia-runtime", "yes" if check.check_nvidia_runtime else "no",
        "--disk-path", check.disk_path,
        "--min-free-disk-gb", str(check.min_free_disk_gb),
        "--model-host-path", model or "",
        "--device-paths", ",".join(devices),
        # PORT=KEY: the failure names the stack key to change.
        "--ports", ",".join(f"{port}={key}" for port, key in cfg.ports_on(address).items()),
    ]
    # router-members.py on the router's node; door-slots.py on both door nodes of a virtual IP.
    door = cfg.router.door
    if (cfg.router.kind == "rust" and address == cfg.router.node) or (
            door is not None and door.nodes is not None and address in door.nodes):
        argv += ["--needs-python", "yes"]
    if cfg.firewall.enabled:
        argv += ["--needs-nft", "yes"]
    return f"{shell(argv)} <<'KIMIPD_PREFLIGHT'\n{script}KIMIPD_PREFLIGHT"


def wait_healthy_command(cfg: ClusterConfig, plan: ContainerPlan,
                         fingerprint: bool = False) -> str:
    """FINGERPRINT (a group's rank 0): also print the fingerprint of the checkpoint it loaded,
    where a mount puts model.path on the node (render/contract.py)."""
    model = model_host_path(cfg) if fingerprint else None
    return shell([
        "bash", WAIT_HEALTHY_SCRIPT,
        "--url", plan.health_url,
        "--container", plan.name,
        "--node", plan.node,
        "--timeout", str(cfg.gates.timeout_seconds),
        "--interval", f"{cfg.gates.interval_seconds:g}",
        *(["--fingerprint", model] if model else []),
    ])


def bootstrap_url(group: GroupSpec) -> str:
    """Prefill rank 0's KV bootstrap server (SGLang 0.5.19: `/health` answers 200 on it)."""
    return f"http://{group.rank0}:{group.bootstrap_port}/health"


# The bootstrap gate's poll: decode's whole start waits on it, and each poll is one local HTTP
# connect and one `docker inspect` on the node, so it polls at least this often.
BOOTSTRAP_POLL_SECONDS = 0.5


def wait_bootstrap_command(cfg: ClusterConfig, group_name: str) -> str:
    """The bootstrap gate of a prefill group, polled on rank 0's node: any HTTP answer passes.

    SGLang 0.5.19 starts the bootstrap server with the tokenizer manager, before rank 0 waits for
    the model to load (`engine.py`), so this opens long before the group's /health turns 200.
    """
    group = cfg.groups[group_name]
    role = rank_role(group_name, 0)
    return shell([
        "bash", WAIT_HEALTHY_SCRIPT,
        "--url", bootstrap_url(group),
        "--any-status",
        "--container", container_name(role),
        "--node", group.rank0,
        "--timeout", str(cfg.gates.timeout_seconds),
        "--interval", f"{min(cfg.gates.interval_seconds, BOOTSTRAP_POLL_SECONDS):g}",
    ])


def image_env_check_command(cfg: ClusterConfig, address: str, image: str, script: str) -> str:
    """assets/image-env-check.sh fed on stdin: refuses an image whose own environment breaks a
    hard rule (expandable segments, NCCL/GLOO on the management interface)."""
    argv = [
        "bash", "-s", "--",
        "--node", address,
        "--image", image,
        "--management-interface", cfg.network.management_interface,
        "--overridden", ",".join(variables_set_in_every_container(cfg)),
    ]
    return f"{shell(argv)} <<'KIMIPD_IMAGE_CHECK'\n{script}KIMIPD_IMAGE_CHECK"
