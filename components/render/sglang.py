"""SGLang servers: each rank's argv, environment and container."""

from __future__ import annotations

import json
import re

from ..config import ClusterConfig, GroupSpec
from .container_plan import ContainerPlan, container_plan
from .layout import NODE_ASSET_DIR, rank_role, shell
from .node_files import launch_wrapper


def worker_key_dir(cfg: ClusterConfig) -> str:
    # One per stack on shared nodes, by router port like the router's own state directory.
    return f"{NODE_ASSET_DIR}/keys-{cfg.router.port}"


def worker_key_file(cfg: ClusterConfig) -> str:
    """SGLang's --config file (YAML) holding `api-key`, root-only on every node with a rank and
    mounted read-only with the assets directory: SGLang merges it into its arguments in process,
    so the key is on no command line, in no `docker inspect` and in no environment."""
    return f"{worker_key_dir(cfg)}/sglang.yaml"


def worker_key_yaml(key: str, admin_key: str | None = None) -> str:
    """The file's content. A JSON string is a YAML string, whatever characters the key has;
    stripped as router-launch.py strips the router's copy (a key set from a file may end in a
    newline), so the two always agree. ADMIN_KEY (the secret adminApiKey): SGLang's admin
    routes then take it alone, and no longer the key the routers send."""
    content = f"api-key: {json.dumps(key.strip())}\n"
    if admin_key is not None:
        content += f"admin-api-key: {json.dumps(admin_key.strip())}\n"
    return content


def write_worker_key_command(cfg: ClusterConfig) -> str:
    """Writes stdin (the file's content, a secret) readable by root only, whole or not at all."""
    directory, path = worker_key_dir(cfg), worker_key_file(cfg)
    return (f"umask 077 && mkdir -p {shell([directory])} && cat > {shell([path + '.new'])} && "
            f"mv {shell([path + '.new', path])}")


def remove_worker_key_command(cfg: ClusterConfig) -> str:
    return f"rm -rf {shell([worker_key_dir(cfg)])}"


def sglang_launch_args(cfg: ClusterConfig, group_name: str, rank: int) -> list[str]:
    """`python3 -m sglang.launch_server ...` for one rank; every rank differs only in
    --node-rank."""
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
    if cfg.workers_keyed:
        # The router's key (`--api-key`), from a root-only file: every route but /health* and
        # /metrics* then needs it, the admin ones included (no separate admin key).
        args += ["--config", worker_key_file(cfg)]
    return args + list(group.extra_args)


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


# SGLang 0.5.19's /health on rank 0 (srt/entrypoints/http_server.py, health_generate): a
# one-token generate, a 1 s sleep, then up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) waiting for any
# output of the scheduler before it answers 503. A busy group answers late, and is healthy.
SGLANG_HEALTH_SLEEP_SECONDS = 1.0
SGLANG_HEALTH_CHECK_TIMEOUT_DEFAULT = 20.0


def health_seconds(cfg: ClusterConfig, group_name: str) -> float:
    """How long GROUP's rank 0 may take to answer /health and still be healthy, as SGLang judges
    it: its sleep and its SGLANG_HEALTH_CHECK_TIMEOUT (the group's env, else SGLang's 20 s). What
    status, reconcile and a drain give the probe, a margin on top (docs/healing.md)."""
    raw = sglang_env(cfg, group_name, 0).get("SGLANG_HEALTH_CHECK_TIMEOUT")
    try:
        timeout = float(raw) if raw is not None else SGLANG_HEALTH_CHECK_TIMEOUT_DEFAULT
    except ValueError:
        timeout = SGLANG_HEALTH_CHECK_TIMEOUT_DEFAULT  # SGLang itself refuses it at start
    return SGLANG_HEALTH_SLEEP_SECONDS + max(0.0, timeout)


# A group's load bound, unset in the config, follows its last measured load: twice it (a load
# from a colder page cache, a busier node), never under the floor (the sim's stand-in loads in
# seconds; a container's start on a loaded node takes longer than its load) nor over the gate's
# own timeout (a load that long failed its gate). No load measured yet: the gate's timeout.
LOAD_BOUND_FACTOR = 2
LOAD_BOUND_FLOOR_SECONDS = 120
GATE_HEALTHY_LINE = re.compile(r": healthy after (\d+)s \(", re.MULTILINE)


def measured_load_seconds(gate_stdout: str | None) -> int | None:
    """How long rank 0 took to serve at its last start, as its gate printed it
    (assets/wait-healthy.sh: `NAME: healthy after Ns (URL)`), or None."""
    found = GATE_HEALTHY_LINE.search(gate_stdout or "")
    return int(found.group(1)) if found else None


def load_bound_seconds(configured: int | None, measured: int | None,
                       gate_timeout: int) -> int:
    """How long a group may load before a running group that does not serve is hung: the
    config's `loadBoundSeconds`, else from its last measured load (LOAD_BOUND_FACTOR)."""
    if configured is not None:
        return configured
    if measured is None:
        return gate_timeout
    return min(gate_timeout, max(LOAD_BOUND_FLOOR_SECONDS, LOAD_BOUND_FACTOR * measured))


def health_url(group: GroupSpec, rank: int = 0) -> str:
    """Rank 0: the API's /health (200 once warmed up). Ranks >= 1: the dummy health server SGLang
    starts on --host:--port once that rank's model is loaded (engine.py,
    `launch_dummy_health_check_server`)."""
    return f"http://{group.nodes[rank]}:{group.http_port}/health"


def group_endpoint(group: GroupSpec) -> str:
    return f"http://{group.rank0}:{group.http_port}"


def sglang_rank_plan(cfg: ClusterConfig, group_name: str, rank: int) -> ContainerPlan:
    group = cfg.groups[group_name]
    return container_plan(cfg, rank_role(group_name, rank), group.nodes[rank],
                          sglang_command(cfg, group_name, rank), sglang_env(cfg, group_name, rank),
                          health_url(group, rank), gpu_workload=True, group_name=group_name)


def variables_set_in_every_container(cfg: ClusterConfig) -> list[str]:
    """Names every SGLang rank's env sets: for those, the image's own value never applies."""
    names = None
    for name, group in cfg.groups.items():
        for rank in range(len(group.nodes)):
            keys = set(sglang_env(cfg, name, rank))
            names = keys if names is None else names & keys
    return sorted(names or ())
