"""Pure renderers: the typed model in, the exact argv / environment / shell line out.

Nothing here imports Pulumi. What these functions return is what `pulumi preview --diff` shows
and what runs on a node, so a reviewer reads this file to see exactly what will run. Flags target
SGLang 0.5.19 (`python/sglang/srt/server_args.py`) and sglang-router 0.3.2.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from . import versions
from .config import MOONCAKE_WHEEL_PREFIX, ClusterConfig, GroupSpec

# Where the program's own scripts (assets/) land on every node, mounted read-only into containers.
NODE_ASSET_DIR = "/opt/kimipd"
LAUNCH_SCRIPT = f"{NODE_ASSET_DIR}/launch.sh"
WAIT_HEALTHY_SCRIPT = f"{NODE_ASSET_DIR}/wait-healthy.sh"
SMOKE_TEST_SCRIPT = f"{NODE_ASSET_DIR}/smoke-test.sh"
# preflight.sh is not among them: it runs from stdin before anything is written to the node.
NODE_SCRIPTS = ("launch.sh", "mooncake-check.py", "wait-healthy.sh", "smoke-test.sh",
                "prepare-image.sh")
PREPARE_IMAGE_SCRIPT = f"{NODE_ASSET_DIR}/prepare-image.sh"

MOONCAKE_MASTER = "mooncake-master"
ROUTER = "router"


def rank_role(group_name: str, rank: int) -> str:
    return f"{group_name}-r{rank}"


def container_name(role: str) -> str:
    return f"kimipd-{role}"


def container_labels(cfg: ClusterConfig, role: str,
                     group_name: str | None = None) -> dict[str, str]:
    # The generations are labels so that bumping one changes an input that forces replacement:
    # the global one on every container, a group's own on that group's ranks.
    labels = {
        "kimipd.role": role,
        "kimipd.restart-generation": str(cfg.restart_generation),
    }
    if group_name is not None:
        labels |= {"kimipd.group": group_name,
                   "kimipd.group-restart-generation":
                       str(cfg.groups[group_name].restart_generation)}
    return labels


# -- SGLang servers ----------------------------------------------------------------------------


def sglang_launch_args(cfg: ClusterConfig, group_name: str, rank: int) -> list[str]:
    """`python3 -m sglang.launch_server ...` for one rank; every rank differs only in --node-rank."""
    group = cfg.groups[group_name]
    args = ["python3", "-m", "sglang.launch_server", "--model-path", cfg.model.path]
    if cfg.model.served_model_name:
        args += ["--served-model-name", cfg.model.served_model_name]
    args += [
        "--trust-remote-code",
        "--disaggregation-mode", group.mode,
        "--disaggregation-transfer-backend", group.transfer_backend,
        "--disaggregation-ib-device", ",".join(cfg.network.rdma_devices),
        # The bootstrap port must match on all ranks: prefill ranks register with rank 0 on it.
        "--disaggregation-bootstrap-port", str(group.bootstrap_port),
        "--tp-size", str(group.tp_size),
        "--ep-size", str(group.ep_size),
        "--nnodes", str(len(group.nodes)),
        "--node-rank", str(rank),
        "--dist-init-addr", f"{group.rank0}:{group.dist_init_port}",
        # The bootstrap server binds --host; 127.0.0.1 (SGLang's default) would hide it from decode.
        "--host", "0.0.0.0",
        "--port", str(group.http_port),
    ]
    if cfg.metrics.enabled:
        # Rank 0 serves /metrics on --port, ranks >= 1 on their dummy health server.
        args.append("--enable-metrics")
    return args + list(group.extra_args)


def node_file_install_args(cfg: ClusterConfig, *, mooncake_only: bool = False) -> list[str]:
    """launch.sh's options: the node files' wheels (the Mooncake one in place of the image's),
    the patches, and the Mooncake release Python must then import."""
    args = []
    for node_file in cfg.node_files:
        if node_file.is_wheel and node_file.file_name.startswith(MOONCAKE_WHEEL_PREFIX):
            args += ["--mooncake-wheel", node_file.destination]
        elif node_file.is_wheel and not mooncake_only:
            args += ["--wheel", node_file.destination]
    for node_file in cfg.node_files:
        if node_file.is_patch and not mooncake_only:
            args += ["--patch", node_file.destination]
    return args + ["--require-mooncake", versions.MOONCAKE_MIN]


def launch_wrapper(cfg: ClusterConfig, *, mooncake_only: bool = False) -> list[str]:
    """assets/launch.sh in front of every server (it execs it, and resolves the master's binary).

    installNodeFiles `image`: the node's prepared image already holds the wheels and patches,
    proven when it was built, so launch.sh only execs. `container-start`: launch.sh installs
    them in every container as it starts. mooncake_only (the master): just the Mooncake wheel; a
    failed patch must not take the metadata service down with it.
    """
    if cfg.install_node_files == "image":
        return ["bash", LAUNCH_SCRIPT, "--"]
    return ["bash", LAUNCH_SCRIPT, *node_file_install_args(cfg, mooncake_only=mooncake_only), "--"]


def sglang_command(cfg: ClusterConfig, group_name: str, rank: int) -> list[str]:
    return launch_wrapper(cfg) + sglang_launch_args(cfg, group_name, rank)


def network_env(cfg: ClusterConfig) -> dict[str, str]:
    net = cfg.network
    env = {
        # Runbook rule 4: collective traffic on the compute network, never bond0.
        "NCCL_SOCKET_IFNAME": net.nccl_interface,
        "GLOO_SOCKET_IFNAME": net.gloo_interface,
        "NCCL_IB_HCA": ",".join(net.rdma_devices),
    }
    if net.ib_gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(net.ib_gid_index)
        env["MC_GID_INDEX"] = str(net.ib_gid_index)
    return env


def sglang_env(cfg: ClusterConfig, group_name: str, rank: int) -> dict[str, str]:
    group = cfg.groups[group_name]
    return {
        # The address KV ZMQ sockets and the Mooncake engine advertise: this node's compute address.
        "SGLANG_HOST_IP": group.nodes[rank],
        **network_env(cfg),
        **cfg.container.env,
        **group.env,
    }


def health_url(group: GroupSpec, rank: int = 0) -> str:
    """Rank 0: the API's /health (200 once warmed up). Ranks >= 1: the dummy health server SGLang
    starts on --host:--port once that rank's model is loaded (engine.py,
    `launch_dummy_health_check_server`)."""
    return f"http://{group.nodes[rank]}:{group.http_port}/health"


def group_endpoint(group: GroupSpec) -> str:
    return f"http://{group.rank0}:{group.http_port}"


# -- Mooncake master and router ----------------------------------------------------------------


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


def router_command(cfg: ClusterConfig) -> list[str]:
    router = cfg.router
    args = ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    if router.kind == "mini-lb":
        args.append("--mini-lb")
    else:
        args += ["--policy", router.policy]
    for group in cfg.groups_in_mode("prefill").values():
        args += ["--prefill", group_endpoint(group), str(group.bootstrap_port)]
    for group in cfg.groups_in_mode("decode").values():
        args += ["--decode", group_endpoint(group)]
    args += ["--host", router.host, "--port", str(router.port)]
    return args + list(router.extra_args)


def router_url(cfg: ClusterConfig) -> str:
    return f"http://{cfg.router.node}:{cfg.router.port}"


# -- commands run on the node over SSH ----------------------------------------------------------


def docker_ssh_opts(cfg: ClusterConfig) -> list[str]:
    """Options for the docker provider's `ssh`: the pinned host keys first, then the operator's."""
    pinned = []
    if cfg.connection.known_hosts_file is not None:
        pinned = ["-o", f"UserKnownHostsFile={cfg.connection.known_hosts_file}",
                  "-o", "StrictHostKeyChecking=yes"]
    return pinned + list(cfg.connection.docker_ssh_opts)


def _shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)


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
    runs_rank = any(role not in (MOONCAKE_MASTER, ROUTER) for role in cfg.roles_of(address))
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
    return f"{_shell(argv)} <<'KIMIPD_PREFLIGHT'\n{script}KIMIPD_PREFLIGHT"


def wait_healthy_command(cfg: ClusterConfig, plan: ContainerPlan) -> str:
    return _shell([
        "bash", WAIT_HEALTHY_SCRIPT,
        "--url", plan.health_url,
        "--container", plan.name,
        "--node", plan.node,
        "--timeout", str(cfg.gates.timeout_seconds),
        "--interval", f"{cfg.gates.interval_seconds:g}",
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
    return _shell([
        "bash", WAIT_HEALTHY_SCRIPT,
        "--url", bootstrap_url(group),
        "--any-status",
        "--container", container_name(role),
        "--node", group.rank0,
        "--timeout", str(cfg.gates.timeout_seconds),
        "--interval", f"{min(cfg.gates.interval_seconds, BOOTSTRAP_POLL_SECONDS):g}",
    ])


def smoke_test_command(cfg: ClusterConfig) -> str:
    return _shell([
        "bash", SMOKE_TEST_SCRIPT,
        "--url", router_url(cfg) + "/generate",
        "--body", json.dumps(cfg.smoke_test.body, sort_keys=True),
        "--timeout", str(cfg.smoke_test.timeout_seconds),
    ])


def variables_set_in_every_container(cfg: ClusterConfig) -> list[str]:
    """Names every SGLang rank's env sets: for those, the image's own value never applies."""
    names = None
    for name, group in cfg.groups.items():
        for rank in range(len(group.nodes)):
            keys = set(sglang_env(cfg, name, rank))
            names = keys if names is None else names & keys
    return sorted(names or ())


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
    return f"{_shell(argv)} <<'KIMIPD_IMAGE_CHECK'\n{script}KIMIPD_IMAGE_CHECK"


PREPARED_IMAGE_REPOSITORY = "kimipd/prepared"


def prepared_image_tag(cfg: ClusterConfig, base_image_id: str, file_digests: dict[str, str],
                       scripts: dict[str, str]) -> str:
    """A tag that names every input of the prepared image: a changed wheel, patch, script or base
    image is a new tag (so a new build and new containers); the same inputs reuse the image."""
    inputs = {
        "base": base_image_id,
        "install": node_file_install_args(cfg),
        "files": {f.destination: file_digests[f.destination] for f in cfg.node_files},
        "scripts": {name: hashlib.sha256(text.encode()).hexdigest()
                    for name, text in sorted(scripts.items())},
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{PREPARED_IMAGE_REPOSITORY}:{digest[:20]}"


def prepare_image_command(cfg: ClusterConfig, address: str, base_image_id: str, tag: str,
                          stack: str, file_digests: dict[str, str]) -> str:
    """assets/prepare-image.sh on the node: build (or reuse) its prepared image from exactly the
    files whose digests the stack knows (it checks each one it builds from)."""
    argv = ["bash", PREPARE_IMAGE_SCRIPT, "--node", address, "--base", base_image_id,
            "--tag", tag, "--stack", stack]
    for node_file in cfg.node_files:
        argv += ["--sha256", node_file.destination, file_digests[node_file.destination]]
    return _shell([*argv, "--", *node_file_install_args(cfg)])


def prepared_image_id(stdout: str) -> str:
    """The image id prepare-image.sh prints last."""
    lines = stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("sha256:"):
        raise ValueError(f"prepare-image.sh printed no image id: {stdout[-500:]!r}")
    return lines[-1]


def prepare_dirs_command(cfg: ClusterConfig) -> str:
    dirs = sorted({NODE_ASSET_DIR} | {f.destination.rsplit("/", 1)[0] or "/" for f in cfg.node_files})
    return _shell(["mkdir", "-p", *dirs])


def smoke_test_text(stdout: str) -> str:
    """The generated text from the smoke test's JSON response (what the stack output shows)."""
    response = json.loads(stdout)
    text = response.get("text") if isinstance(response, dict) else None
    if not isinstance(text, str):
        raise ValueError(f"router answered without a 'text' field: {stdout[:500]}")
    return text


# -- containers: everything docker is told about each one ------------------------------------


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


def _plan(cfg: ClusterConfig, role: str, node: str, command: list[str], env: dict[str, str],
          health: str, gpu_workload: bool, runtime: str | None = None,
          group_name: str | None = None) -> ContainerPlan:
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


def mooncake_master_env(cfg: ClusterConfig) -> dict[str, str]:
    env = dict(cfg.container.env)
    if cfg.mooncake_master.runtime == "nvidia":
        # Driver libraries (libcuda) mounted, no GPU claimed: the ranks own every GPU.
        env |= {"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    return env


def mooncake_master_plan(cfg: ClusterConfig) -> ContainerPlan:
    return _plan(cfg, MOONCAKE_MASTER, cfg.mooncake_master.node, mooncake_master_command(cfg),
                 mooncake_master_env(cfg), mooncake_master_health_url(cfg), gpu_workload=False,
                 runtime=cfg.mooncake_master.runtime)


def sglang_rank_plan(cfg: ClusterConfig, group_name: str, rank: int) -> ContainerPlan:
    group = cfg.groups[group_name]
    return _plan(cfg, rank_role(group_name, rank), group.nodes[rank],
                 sglang_command(cfg, group_name, rank), sglang_env(cfg, group_name, rank),
                 health_url(group, rank), gpu_workload=True, group_name=group_name)


def router_plan(cfg: ClusterConfig) -> ContainerPlan:
    return _plan(cfg, ROUTER, cfg.router.node, router_command(cfg), dict(cfg.container.env),
                 router_url(cfg) + "/health", gpu_workload=False)


def container_mounts(cfg: ClusterConfig) -> list[tuple[str, str, bool]]:
    """The program's scripts, the node files (at their node paths) and the operator's volumes."""
    mounts = [(NODE_ASSET_DIR, NODE_ASSET_DIR, True)]
    mounts += [(f.destination, f.destination, True) for f in cfg.node_files]
    mounts += [(v.host_path, v.container_path, v.read_only) for v in cfg.container.volumes]
    return mounts


def env_list(env: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in sorted(env.items())]


def prometheus_targets(cfg: ClusterConfig, stack: str) -> list[dict[str, object]]:
    """A Prometheus file_sd_configs document: every SGLang rank's /metrics (rank 0 on the API
    port, ranks >= 1 on their dummy health server, same port) and the Mooncake master's metrics
    port. Empty unless metrics.enabled. MiniLB serves no metrics, so the router is not listed."""
    if not cfg.metrics.enabled:
        return []
    master = cfg.mooncake_master
    targets: list[dict[str, object]] = [{
        "targets": [f"{master.node}:{master.metrics_port}"],
        "labels": {"stack": stack, "role": MOONCAKE_MASTER, "node": master.node},
    }]
    for name, group in cfg.groups.items():
        for rank, node in enumerate(group.nodes):
            targets.append({
                "targets": [f"{node}:{group.http_port}"],
                "labels": {"stack": stack, "role": rank_role(name, rank), "group": name,
                           "mode": group.mode, "rank": str(rank), "node": node},
            })
    return targets
