"""The pack's validations: plain functions over a resource's inputs, so they are tested without
the policy SDK (which starts a gRPC server when a PolicyPack is built; see __main__.py).

Each `validate_*` has the policy SDK's signature `(args, report_violation)`; `args` needs only
`resource_type`, `props` (the inputs, camelCase) and `get_config()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

CONTAINER = "docker:index/container:Container"
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
SOCKET_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
DEFAULT_MANAGEMENT_INTERFACE = "bond0"

ReportViolation = Callable[..., None]


def container_env(props: Mapping[str, Any]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in props.get("envs") or [] if "=" in item)


def flag_value(command: list[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value` in COMMAND (the last one wins, as argparse)."""
    value = None
    for i, token in enumerate(command):
        if token == flag and i + 1 < len(command):
            value = command[i + 1]
        elif token.startswith(flag + "="):
            value = token.split("=", 1)[1]
    return value


def _role(props: Mapping[str, Any]) -> str:
    return props.get("name") or "a container"


def expandable_segments(props: Mapping[str, Any]) -> list[str]:
    env = container_env(props)
    return [f"{_role(props)}: {name}={env[name]!r}: expandable_segments:True makes Mooncake RDMA "
            "registration fail (Bad address, Mooncake #2511/#351); remove it."
            for name in ALLOCATOR_VARIABLES
            if re.search(r"expandable_segments\s*:\s*true", env.get(name, ""), re.IGNORECASE)]


def management_interface(props: Mapping[str, Any], management: str) -> list[str]:
    """NCCL/GLOO socket interfaces that can resolve to the management interface: the interface
    itself, a prefix of it (NCCL matches prefixes: `bond` is bond0 too), or an exclusion list."""
    env = container_env(props)
    problems = []
    for name in SOCKET_VARIABLES:
        value = env.get(name)
        if value is None:
            continue
        if value.startswith("^"):
            problems.append(f"{_role(props)}: {name}={value!r} is an exclusion list, so NCCL/GLOO "
                            f"may pick the management interface {management}; name the compute "
                            "interface instead.")
            continue
        for item in value.split(","):
            interface = item.strip().lstrip("=")
            exact = item.strip().startswith("=")
            if interface and (interface == management
                              or (not exact and management.startswith(interface))):
                problems.append(f"{_role(props)}: {name}={value!r} puts NCCL/GLOO traffic on the "
                                f"management interface {management}; name the compute interface.")
                break
    return problems


def nixl_backend(props: Mapping[str, Any]) -> list[str]:
    backend = flag_value(list(props.get("command") or []), "--disaggregation-transfer-backend")
    if backend == "nixl":
        return [f"{_role(props)}: --disaggregation-transfer-backend nixl fails above ~20 MB "
                "transfers on this hardware; use mooncake."]
    return []


def restart_policy(props: Mapping[str, Any]) -> list[str]:
    nnodes = flag_value(list(props.get("command") or []), "--nnodes")
    restart = props.get("restart") or "no"
    if nnodes is not None and nnodes.isdigit() and int(nnodes) > 1 and restart != "no":
        return [f"{_role(props)}: restart {restart!r} on a rank of a {nnodes}-node group: a lone "
                "restarted rank cannot rejoin its NCCL group; use restart 'no' (the group is "
                "replaced in order by `pulumi up`)."]
    return []


def privileged(props: Mapping[str, Any], allowed: bool) -> list[str]:
    if props.get("privileged") and not allowed:
        return [f"{_role(props)}: privileged container; grant the capabilities it needs instead, "
                "or allow it in the pack's config "
                "(kimipd-no-privileged: {\"allowPrivileged\": true})."]
    return []


def _report(args: Any, report_violation: ReportViolation, problems: list[str]) -> None:
    for message in problems:
        report_violation(message)


def validate_no_expandable_segments(args: Any, report_violation: ReportViolation) -> None:
    if args.resource_type == CONTAINER:
        _report(args, report_violation, expandable_segments(args.props))


def validate_nccl_off_management(args: Any, report_violation: ReportViolation) -> None:
    if args.resource_type == CONTAINER:
        management = (args.get_config() or {}).get("managementInterface",
                                                   DEFAULT_MANAGEMENT_INTERFACE)
        _report(args, report_violation, management_interface(args.props, management))


def validate_no_nixl(args: Any, report_violation: ReportViolation) -> None:
    if args.resource_type == CONTAINER:
        _report(args, report_violation, nixl_backend(args.props))


def validate_restart_no(args: Any, report_violation: ReportViolation) -> None:
    if args.resource_type == CONTAINER:
        _report(args, report_violation, restart_policy(args.props))


def validate_no_privileged(args: Any, report_violation: ReportViolation) -> None:
    if args.resource_type == CONTAINER:
        allowed = bool((args.get_config() or {}).get("allowPrivileged", False))
        _report(args, report_violation, privileged(args.props, allowed))
