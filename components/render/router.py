"""The router: its argv and container, and the smoke test sent through it."""

from __future__ import annotations

import json

from ..config import ClusterConfig
from .container_plan import ContainerPlan, container_plan
from .layout import ROUTER, SMOKE_TEST_SCRIPT, shell
from .sglang import group_endpoint


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

def router_plan(cfg: ClusterConfig) -> ContainerPlan:
    return container_plan(cfg, ROUTER, cfg.router.node, router_command(cfg), dict(cfg.container.env),
                 router_url(cfg) + "/health", gpu_workload=False)

def smoke_test_command(cfg: ClusterConfig) -> str:
    return shell([
        "bash", SMOKE_TEST_SCRIPT,
        "--url", router_url(cfg) + "/generate",
        "--body", json.dumps(cfg.smoke_test.body, sort_keys=True),
        "--timeout", str(cfg.smoke_test.timeout_seconds),
    ])

def smoke_test_text(stdout: str) -> str:
    """The generated text from the smoke test's JSON response (what the stack output shows)."""
    response = json.loads(stdout)
    text = response.get("text") if isinstance(response, dict) else None
    if not isinstance(text, str):
        raise ValueError(f"router answered without a 'text' field: {stdout[:500]}")
    return text
