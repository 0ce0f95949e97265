"""The rust router's membership: each group admitted once its gate passes, drained before it goes.

Every command runs on the router's node (router-members.py; the door's slots: door-slots.py),
where the worker API answers on loopback and the rollout's leases live. Three commands per
group, because they live and die at different times (docs/decisions.md):
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
from ..config.router_schema import SLOT_NAMES
from .door import door_admin_socket, slot_server, slot_url
from .layout import DOOR_SLOTS_SCRIPT, ROUTER_MEMBERS_SCRIPT, router_state_dir, shell
from .router import router_api_key_file, router_loopback_url, router_slots
from .sglang import group_endpoint, health_seconds


def _members(cfg: ClusterConfig, action: str, *args: str, timeout: int | None = None,
             slots: list[str | None] | None = None, script: str = ROUTER_MEMBERS_SCRIPT,
             keyed: bool = True, door: bool = False) -> str:
    """router-members.py (or door-slots.py) ACTION on the router's node; SLOTS: the routers it
    talks to (every one unless said); KEYED: with the rust router's key file; DOOR: with each
    router's name at the door and router.node's door (a change of contract takes a slot out
    there)."""
    routers: list[str] = []
    for slot in router_slots(cfg) if slots is None else slots:
        routers += ["--router", router_loopback_url(cfg, slot)]
        if door and slot is not None:
            routers += ["--slot", slot_server(slot)]
    if door and cfg.router.door is not None:
        routers += ["--door-socket", door_admin_socket(cfg)]
    key = (["--api-key-file", router_api_key_file(cfg)]
           if cfg.router.kind == "rust" and keyed else [])
    return shell(["python3", script, action, *routers, *key,
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
    # With the door: a rollout reverted midway may hand this group's slot to the contract that
    # has a whole pair serving nowhere, out at router.node's door first (router-members.py).
    # --health-seconds: how long its rank 0's /health may take, as SGLang judges it; a busy
    # group answers late, and only one that fails it is hung (its requests given up).
    return _members(cfg, "drain", *_group_args(cfg, group_name),
                    "--rollout", cfg.rollout,
                    "--drain-timeout", str(cfg.router.drain_timeout_seconds),
                    "--health-seconds", f"{health_seconds(cfg, group_name):g}", door=True)


def _bootstrap(cfg: ClusterConfig, group_name: str) -> list[str]:
    group = cfg.groups[group_name]
    return ["--bootstrap-port", str(group.bootstrap_port)] if group.mode == "prefill" else []


def admit_command(cfg: ClusterConfig, group_name: str, contract: str) -> str:
    """Registered with every router once its gate passes, under CONTRACT (render/contract.py):
    a router holding another contract is emptied of it first where that costs nothing, or left
    as it is (router-members.py)."""
    return _members(cfg, "admit", *_group_args(cfg, group_name), *_bootstrap(cfg, group_name),
                    "--contract", contract, door=True)


def restore_command(cfg: ClusterConfig, slot: str | None = None) -> str:
    """A new router's first step: every group that should serve and is not out for its
    replacement, registered at once (the rest come back through their admission)."""
    return _members(cfg, "restore", slots=[slot])


def slot_want_command(cfg: ClusterConfig, slot: str) -> str:
    return _members(cfg, "want", "--slot", slot, slots=[], script=DOOR_SLOTS_SCRIPT)


def slot_unwant_command(cfg: ClusterConfig, slot: str) -> str:
    return _members(cfg, "unwant", "--slot", slot, slots=[], script=DOOR_SLOTS_SCRIPT)


def slot_drain_command(cfg: ClusterConfig, slot: str) -> str:
    """Before slot SLOT's router is replaced: the slot lease once the other slot serves at the
    door, then drain at the door until its open requests end. Bounded by the gate timeout per
    wait: the other slot's replacement has failed its gate by then."""
    other = next(name for name in SLOT_NAMES if name != slot)
    return _members(cfg, "drain", "--slot", slot, "--other", other,
                    "--door-socket", door_admin_socket(cfg),
                    "--drain-timeout", str(cfg.router.drain_timeout_seconds), slots=[],
                    script=DOOR_SLOTS_SCRIPT)


def slot_admit_command(cfg: ClusterConfig, slot: str) -> str:
    """Slot SLOT's new router: every group registered and healthy in it (rust), /readiness, then
    ready at the door until the door's own check sees it up; gives the slot lease back."""
    kind = ["--mini-lb"] if cfg.router.kind == "mini-lb" else []
    return _members(cfg, "admit", "--slot", slot, "--door-socket", door_admin_socket(cfg),
                    *kind, slots=[slot], script=DOOR_SLOTS_SCRIPT)


def slot_door_drain_command(cfg: ClusterConfig, slot: str) -> str:
    """On the other door node, after the router node's drain of slot SLOT (which holds the slot
    lease): drain there too, until its open requests there end."""
    return _members(cfg, "door-drain", "--slot", slot, "--door-socket", door_admin_socket(cfg),
                    "--drain-timeout", str(cfg.router.drain_timeout_seconds), slots=[],
                    script=DOOR_SLOTS_SCRIPT, keyed=False)


def slot_door_admit_command(cfg: ClusterConfig, slot: str) -> str:
    """On the other door node, before the router node's admission of slot SLOT gives the lease
    back: once the slot serves (at its node's address: no key needed), ready there too."""
    kind = ["--mini-lb"] if cfg.router.kind == "mini-lb" else []
    return _members(cfg, "door-admit", "--slot", slot, "--door-socket", door_admin_socket(cfg),
                    "--router", slot_url(cfg, slot), *kind, slots=[], script=DOOR_SLOTS_SCRIPT,
                    keyed=False)


def router_ready_command(cfg: ClusterConfig) -> str:
    """The rust router's gate, once every group is admitted: /readiness (a healthy prefill and
    decode registered) and every group's rank 0 registered and healthy in GET /workers."""
    expected: list[str] = []
    for group in cfg.groups.values():
        expected += ["--expect", group_endpoint(group)]
    return _members(cfg, "ready", *expected)
