"""The policy pack's validations (policy/rules.py), called directly with the inputs the program
gives a container: each hard rule reports on a bad container and is silent on the rendered ones."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from components.config import load_cluster_config
from components.render import env_list, mooncake_master_plan, router_plan, sglang_rank_plan
from policy import rules
from tests.conftest import stack_values

VALIDATIONS = [rules.validate_no_expandable_segments, rules.validate_nccl_off_management,
               rules.validate_no_nixl, rules.validate_restart_no, rules.validate_no_privileged]


def container(plan) -> dict[str, Any]:
    """A docker Container's inputs as the policy SDK sees them (camelCase), from a plan."""
    return {"name": plan.name, "command": list(plan.command), "envs": env_list(plan.env),
            "restart": plan.restart, "privileged": plan.privileged, "networkMode": "host"}


def violations(props: dict[str, Any], config: dict[str, Any] | None = None,
               resource_type: str = rules.CONTAINER) -> list[str]:
    reported: list[str] = []
    args = SimpleNamespace(resource_type=resource_type, props=props, get_config=lambda: config or {})
    for validate in VALIDATIONS:
        validate(args, lambda message, urn=None: reported.append(message))
    return reported


@pytest.fixture(params=["pro6000", "sim"])
def plans(request) -> list:
    cfg = load_cluster_config(stack_values(request.param) | {"image": "x"})
    ranks = [sglang_rank_plan(cfg, name, rank) for name, group in cfg.groups.items()
             for rank in range(len(group.nodes))]
    return [mooncake_master_plan(cfg), *ranks, router_plan(cfg)]


def test_every_rendered_container_passes(plans) -> None:
    for plan in plans:
        assert violations(container(plan)) == [], plan.name


def decode_rank() -> dict[str, Any]:
    cfg = load_cluster_config(stack_values("pro6000"))
    return container(sglang_rank_plan(cfg, "decode", 1))


@pytest.mark.parametrize("variable", rules.ALLOCATOR_VARIABLES)
def test_expandable_segments_under_either_variable(variable: str) -> None:
    props = decode_rank()
    props["envs"] = [*props["envs"], f"{variable}=max_split_size_mb:512,expandable_segments:True"]
    (message,) = violations(props)
    assert message.startswith(f"kimipd-decode-r1: {variable}=") and "Mooncake" in message


@pytest.mark.parametrize("value", ["bond0", "bond", "^docker0,lo", "eth0,bond0"])
def test_nccl_or_gloo_on_the_management_interface(value: str) -> None:
    for variable in rules.SOCKET_VARIABLES:
        props = decode_rank()
        props["envs"] = [e for e in props["envs"] if not e.startswith(variable + "=")] + [f"{variable}={value}"]
        (message,) = violations(props)
        assert f"{variable}={value!r}" in message and "bond0" in message


def test_the_management_interface_comes_from_the_pack_config() -> None:
    props = decode_rank()
    props["envs"] = [e for e in props["envs"] if not e.startswith("NCCL_SOCKET_IFNAME=")] + ["NCCL_SOCKET_IFNAME=eno1"]
    assert violations(props) == []
    assert len(violations(props, {"managementInterface": "eno1"})) == 1
    props["envs"][-1] = "NCCL_SOCKET_IFNAME==bond"  # exact match: not bond0
    assert violations(props) == []


def test_nixl_backend() -> None:
    props = decode_rank()
    command = props["command"]
    command[command.index("--disaggregation-transfer-backend") + 1] = "nixl"
    (message,) = violations(props)
    assert "nixl" in message
    props["command"] = [c for c in command if c not in ("--disaggregation-transfer-backend", "nixl")] + [
        "--disaggregation-transfer-backend=nixl"]
    assert len(violations(props)) == 1


def test_restart_policy_of_a_multi_node_rank() -> None:
    props = decode_rank()
    props["restart"] = "on-failure"
    (message,) = violations(props)
    assert "restart 'on-failure' on a rank of a 4-node group" in message
    cfg = load_cluster_config(stack_values("pro6000"))
    router = container(router_plan(cfg))
    router["restart"] = "unless-stopped"
    assert violations(router) == [], "the router is not a multi-node rank"


def test_privileged_unless_the_config_allows_it() -> None:
    props = decode_rank()
    props["privileged"] = True
    (message,) = violations(props)
    assert "privileged" in message
    assert violations(props, {"allowPrivileged": True}) == []


def test_other_resource_types_are_not_checked() -> None:
    props = copy.deepcopy(decode_rank())
    props["privileged"] = True
    assert violations(props, resource_type="docker:index/remoteImage:RemoteImage") == []
