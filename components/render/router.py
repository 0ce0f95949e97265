"""The router: its argv and container, and the smoke test sent through it."""

from __future__ import annotations

import dataclasses
import json

from .. import versions
from ..config import ClusterConfig
from .container_plan import ContainerPlan, container_plan
from .door import door_ca_file, door_spec, door_url, slot_role
from .layout import ROUTER, ROUTER_LAUNCH_SCRIPT, SMOKE_TEST_SCRIPT, router_state_dir, shell
from .node_files import launch_wrapper
from .sglang import group_endpoint

# MiniLB lives in sglang-router 0.3.2 only; the rust router is smg (components/versions.py).
MINI_LB_MODULE = ["python3", "-m", "sglang_router.launch_router"]
RUST_ROUTER_MODULE = ["python3", "-m", "smg.launch_router"]
# smg's HTTP connection bounds, set rather than inherited: a request head within 30 s, a
# keep-alive connection closed after 90 s idle. The door's own idle connections to a slot are
# purged after 5 s (HAProxy's pool-purge-delay), well inside them.
RUST_CONNECTION_TIMEOUTS = ["--header-read-timeout-secs", "30",
                            "--idle-connection-timeout-secs", "90"]


# On every router container: which release runs it, so that `pulumi preview --diff` names a move
# between them (sglang-router 0.3.2 -> smg 1.13.0) on the router's own line.
ROUTER_RELEASE_LABEL = "kimipd.router-release"


def router_module(cfg: ClusterConfig) -> list[str]:
    return MINI_LB_MODULE if cfg.router.kind == "mini-lb" else RUST_ROUTER_MODULE


def router_release(cfg: ClusterConfig) -> str:
    if cfg.router.kind == "mini-lb":
        return f"sglang-router=={versions.SGLANG_ROUTER} (MiniLB)"
    return f"smg=={versions.SMG}"


def router_command(cfg: ClusterConfig, slot: str | None = None) -> list[str]:
    """The router's argv as its release parses it: MiniLB's (sglang-router 0.3.2), the rust
    router's (smg 1.13.0); SLOT: one of the door's two routers, on its own ports.

    MiniLB has a fixed worker list, so every group is on it. The rust router starts with none:
    each group's Membership admits it through the worker API once the group's gate passes, and
    drains it before it is replaced (docs/decisions.md).
    """
    router = cfg.router
    port, metrics_port = router.port, router.metrics_port
    if slot is not None:
        spec = door_spec(cfg).slot_named()[slot]
        port, metrics_port = spec.port, spec.metrics_port
    args = [*router_module(cfg), "--pd-disaggregation"]
    if router.kind == "mini-lb":
        args.append("--mini-lb")
        for group in cfg.groups_in_mode("prefill").values():
            args += ["--prefill", group_endpoint(group), str(group.bootstrap_port)]
        for group in cfg.groups_in_mode("decode").values():
            args += ["--decode", group_endpoint(group)]
    else:
        args += ["--policy", router.policy]
        if router.prefill_policy is not None:
            args += ["--prefill-policy", router.prefill_policy]
        if router.decode_policy is not None:
            args += ["--decode-policy", router.decode_policy]
        args += [
            "--request-timeout-secs", str(router.request_timeout_seconds),
            "--retry-max-retries", str(router.retry_max_retries),
            "--health-check-interval-secs", str(router.health_check_interval_seconds),
            "--health-failure-threshold", str(router.health_failure_threshold),
            "--health-check-timeout-secs", str(router.health_check_timeout_seconds),
            "--cb-timeout-duration-secs", str(router.circuit_breaker_timeout_seconds),
            "--prometheus-port", str(metrics_port),
            "--prometheus-host", "0.0.0.0",
            # On SIGTERM (its container replaced) it stops accepting and lets the requests it has
            # finish for this long; docker waits as long before killing it (Router).
            "--shutdown-grace-period-secs", str(router.drain_timeout_seconds),
            # A registration whose worker does not answer yet is probed again this often (smg's
            # default, 30 s, admits a group up to 30 s after its gate passed).
            "--worker-startup-check-interval", "1",
            "--max-concurrent-requests", str(router.max_concurrent_requests),
            *RUST_CONNECTION_TIMEOUTS,
        ]
        if not router.worker_overload_protection:
            args.append("--disable-worker-overload-protection")
    args += ["--host", router.host, "--port", str(port)]
    return args + list(router.extra_args)


def router_url(cfg: ClusterConfig) -> str:
    """Where clients send requests: the door when there is one, else the router itself."""
    if cfg.router.door is not None:
        return door_url(cfg)
    return f"http://{cfg.router.node}:{cfg.router.port}"


def router_slots(cfg: ClusterConfig) -> list[str | None]:
    """The routers: [None] (one, on router.port), or the door's two slots."""
    return [None] if cfg.router.door is None else list(door_spec(cfg).slot_named())


def router_loopback_url(cfg: ClusterConfig, slot: str | None = None) -> str:
    """The router (SLOT) as the scripts on router.node reach it: on loopback, or at its own node
    (slot b on the other door node)."""
    if slot is None:
        return f"http://127.0.0.1:{cfg.router.port}"
    node = cfg.slot_node(slot)
    host = "127.0.0.1" if node == cfg.router.node else node
    return f"http://{host}:{door_spec(cfg).slot_named()[slot].port}"


def router_api_key_file(cfg: ClusterConfig | int) -> str:
    return f"{router_state_dir(cfg)}/api-key"


def router_auth_header_file(cfg: ClusterConfig | int) -> str:
    """`Authorization: Bearer KEY`, for `curl -H @FILE` on the router's node (the key never
    on a command line)."""
    return f"{router_state_dir(cfg)}/auth-header"


def router_container_command(cfg: ClusterConfig, slot: str | None = None) -> list[str]:
    """The rust router gets its API key from a file (router-launch.py hands it to the router's own
    parser), never on a command line that `ps` and `docker inspect` show."""
    if cfg.router.kind == "mini-lb":
        return launch_wrapper(cfg) + router_command(cfg, slot)
    # A slot behind the door gets its pair check beside it (the door's health check).
    check = ([] if slot is None else
             ["--pair-check-port", str(door_spec(cfg).slot_named()[slot].check_port)])
    return launch_wrapper(cfg) + ["python3", ROUTER_LAUNCH_SCRIPT, "--api-key-file",
                                  router_api_key_file(cfg), *check, "--",
                                  *router_command(cfg, slot)[len(RUST_ROUTER_MODULE):]]


def router_plan(cfg: ClusterConfig, slot: str | None = None) -> ContainerPlan:
    # /health: liveness only (the rust router binds before any worker is admitted); whether it
    # routes is the RouterReadiness check's, after every group's admission.
    role = ROUTER if slot is None else slot_role(slot)
    node = cfg.router.node if slot is None else cfg.slot_node(slot)
    health = (router_url(cfg) if slot is None
              else f"http://{node}:{door_spec(cfg).slot_named()[slot].port}")
    plan = container_plan(cfg, role, node, router_container_command(cfg, slot),
                          dict(cfg.container.env), health + "/health", gpu_workload=False)
    return dataclasses.replace(plan, labels=plan.labels | {ROUTER_RELEASE_LABEL:
                                                           router_release(cfg)})


def write_api_key_command(cfg: ClusterConfig) -> str:
    """Writes stdin (the secret) to the key file and the header file, readable by their owner
    only (printf is the shell's own: the key is on no process's command line)."""
    directory = router_state_dir(cfg)
    key, header = router_api_key_file(cfg), router_auth_header_file(cfg)
    return (f"umask 077 && mkdir -p {shell([directory])} && cat > {shell([key + '.new'])} && "
            f"printf 'Authorization: Bearer %s\\n' \"$(cat {shell([key + '.new'])})\" > "
            f"{shell([header])} && mv {shell([key + '.new', key])}")


def smoke_test_command(cfg: ClusterConfig) -> str:
    argv = [
        "bash", SMOKE_TEST_SCRIPT,
        "--url", router_url(cfg) + "/generate",
        "--body", json.dumps(cfg.smoke_test.body, sort_keys=True),
        "--timeout", str(cfg.smoke_test.timeout_seconds),
    ]
    if cfg.router.kind == "rust":
        argv += ["--header-file", router_auth_header_file(cfg)]
    if cfg.router.door is not None and door_spec(cfg).tls is not None:
        argv += ["--cacert", door_ca_file(cfg)]
    return shell(argv)


def smoke_test_text(stdout: str) -> str:
    """The generated text from the smoke test's JSON response (what the stack output shows)."""
    response = json.loads(stdout)
    text = response.get("text") if isinstance(response, dict) else None
    if not isinstance(text, str):
        raise ValueError(f"router answered without a 'text' field: {stdout[:500]}")
    return text
