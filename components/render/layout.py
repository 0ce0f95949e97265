"""Where the program's files are on a node, what its containers are called, and how a command
line becomes one shell line."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import ClusterConfig


# Where the program's own scripts (assets/) land on every node, mounted read-only into containers.
NODE_ASSET_DIR = "/opt/kimipd"
LAUNCH_SCRIPT = f"{NODE_ASSET_DIR}/launch.sh"
WAIT_HEALTHY_SCRIPT = f"{NODE_ASSET_DIR}/wait-healthy.sh"
SMOKE_TEST_SCRIPT = f"{NODE_ASSET_DIR}/smoke-test.sh"
# preflight.sh is not among them: it runs from stdin before anything is written to the node.
ROUTER_LAUNCH_SCRIPT = f"{NODE_ASSET_DIR}/router-launch.py"
ROUTER_MEMBERS_SCRIPT = f"{NODE_ASSET_DIR}/router-members.py"
DOOR_SLOTS_SCRIPT = f"{NODE_ASSET_DIR}/door-slots.py"
VIRTUAL_IP_SCRIPT = f"{NODE_ASSET_DIR}/virtual-ip.sh"
NODE_SCRIPTS = ("launch.sh", "mooncake-check.py", "wait-healthy.sh", "smoke-test.sh",
                "prepare-image.sh", "router-launch.py", "router_api.py", "rollout_state.py",
                "router-members.py", "door-slots.py", "virtual-ip.sh")
PREPARE_IMAGE_SCRIPT = f"{NODE_ASSET_DIR}/prepare-image.sh"

MOONCAKE_MASTER = "mooncake-master"
ROUTER = "router"


def router_state_dir(cfg: ClusterConfig | int) -> str:
    """On the router's node: its API key and the rollout's leases (one per router port, so two
    stacks on the same nodes never share them). CFG or the router's port."""
    port = cfg if isinstance(cfg, int) else cfg.router.port
    return f"{NODE_ASSET_DIR}/router-{port}"


def rank_role(group_name: str, rank: int) -> str:
    return f"{group_name}-r{rank}"


def container_name(role: str) -> str:
    return f"kimipd-{role}"


def shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)
