"""The rust router's membership: each group admitted once its gate passes, drained before it goes.

Every command runs on the router's node (router-members.py), where the worker API answers on
loopback and the rollout's leases live. Three commands per group, because they live and die at
different times (docs/decisions.md):
- want: "this group should serve" (a marker file). Kept while the group is in the config, so a
  drain can tell a replacement (come back, keep the others serving) from a removal.
- drain: replaced whenever the group's containers are; its delete, which runs before they go,
  takes the mode's rollout lease once another group of the mode is admitted and healthy, removes
  the group from the router and waits for its in-flight requests.
- admit: registers rank 0 (with the bootstrap port for prefill), waits until the router sees it
  healthy and gives the lease back. Replaced when the group or the router is.
And one for the router: restore, when it is new, registers every group the markers name that is
not out for its replacement, so a change that replaces the router and every group (an image,
restartGeneration) rolls the groups behind a router that serves.
"""

from __future__ import annotations

from ..config import ClusterConfig
from .layout import ROUTER_MEMBERS_SCRIPT, shell
from .router import router_api_key_file, router_state_dir
from .sglang import group_endpoint


def _members(cfg: ClusterConfig, action: str, *args: str, timeout: int | None = None) -> str:
    return shell(["python3", ROUTER_MEMBERS_SCRIPT, action,
                  "--router", f"http://127.0.0.1:{cfg.router.port}",
                  "--api-key-file", router_api_key_file(cfg),
                  "--state-dir", router_state_dir(cfg),
                  "--timeout", str(cfg.gates.timeout_seconds if timeout is None else timeout),
                  "--interval", f"{cfg.gates.interval_seconds:g}",
                  *args])


def _group_args(cfg: ClusterConfig, group_name: str) -> list[str]:
    group = cfg.groups[group_name]
    return ["--group", group_name, "--mode", group.mode, "--url", group_endpoint(group)]


def want_command(cfg: ClusterConfig, group_name: str) -> str:
    # Where and how to register it too: a replaced router gets it back from the marker (restore).
    return _members(cfg, "want", *_group_args(cfg, group_name), *_bootstrap(cfg, group_name))


def unwant_command(cfg: ClusterConfig, group_name: str) -> str:
    return _members(cfg, "unwant", *_group_args(cfg, group_name))


def drain_command(cfg: ClusterConfig, group_name: str) -> str:
    # The lease wait is bounded by the gate timeout: a group whose replacement holds the lease
    # longer than that has failed its gate.
    return _members(cfg, "drain", *_group_args(cfg, group_name),
                    "--rollout", cfg.rollout,
                    "--drain-timeout", str(cfg.router.drain_timeout_seconds))


def _bootstrap(cfg: ClusterConfig, group_name: str) -> list[str]:
    group = cfg.groups[group_name]
    return ["--bootstrap-port", str(group.bootstrap_port)] if group.mode == "prefill" else []


def admit_command(cfg: ClusterConfig, group_name: str) -> str:
    return _members(cfg, "admit", *_group_args(cfg, group_name), *_bootstrap(cfg, group_name))


def restore_command(cfg: ClusterConfig) -> str:
    """A new router's first step: every group that should serve and is not out for its
    replacement, registered at once (the rest come back through their admission)."""
    return _members(cfg, "restore")


def router_ready_command(cfg: ClusterConfig) -> str:
    """The rust router's gate, once every group is admitted: /readiness (a healthy prefill and
    decode registered) and every group's rank 0 registered and healthy in GET /workers."""
    expected: list[str] = []
    for group in cfg.groups.values():
        expected += ["--expect", group_endpoint(group)]
    return _members(cfg, "ready", *expected)
