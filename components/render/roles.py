"""Every container role a config defines, named as the renderers name them: what the program's
containers carry as their `kimipd.role` label, and what `kimipd orphans` judges by (ops/stack.py)
so that a container the state does not know is found whatever it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.router_schema import SLOT_NAMES
from .door import slot_role
from .layout import MOONCAKE_MASTER, ROUTER, rank_role

if TYPE_CHECKING:
    from ..config import ClusterConfig


def container_roles(cfg: ClusterConfig) -> frozenset[str]:
    """The Mooncake master, every rank of every group, and the router: the single one, or the
    door's two slots with a door (and keepalived, with a virtual IP) on each door node, out or
    not. `router` stays in either way: a stack that moved to the door may have left one."""
    roles = {MOONCAKE_MASTER, ROUTER}
    roles |= {rank_role(name, rank) for name, group in cfg.groups.items()
              for rank in range(len(group.nodes))}
    door = cfg.router.door
    if door is not None:
        door_nodes = door.nodes or [cfg.router.node]
        roles |= {slot_role(slot) for slot in SLOT_NAMES}
        roles |= {cfg.door_role(node) for node in door_nodes}
        if door.virtual_ip is not None:
            roles |= {cfg.keepalived_role(node) for node in door_nodes}
    return frozenset(roles)
