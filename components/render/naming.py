"""Names that the program and the operator CLI (ops/) must spell alike: every container role a
config defines, as the renderers name them (what the containers carry as their `kimipd.role`
label, and what `kimipd orphans` judges by, so that a container the state does not know is found
whatever it is), and the component types and URNs that ops names resources by (`kimipd status`
prints a `pulumi up --replace` for a lost firewall table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.router_schema import SLOT_NAMES
from ..config.schema import node_resource_name
from .door import slot_role
from .layout import MOONCAKE_MASTER, ROUTER, rank_role

if TYPE_CHECKING:
    from ..config import ClusterConfig

# Pulumi.yaml's `name` (tests/unit/test_naming.py holds them equal).
PROJECT = "kimipd"
# The component types, each resource's URN is made of (components/cluster.py, node.py,
# firewall.py register under them).
CLUSTER_TYPE = "kimipd:cluster:Cluster"
NODE_TYPE = "kimipd:node:Node"
NODE_FIREWALL_TYPE = "kimipd:firewall:NodeFirewall"
COMMAND_TYPE = "command:remote:Command"


def firewall_resource_name(address: str) -> str:
    """The command that applies the node's nftables table (components/firewall.py)."""
    return f"{node_resource_name(address)}-nftables"


def firewall_urn(stack: str, address: str) -> str:
    """The URN of ADDRESS's table in STACK: what `pulumi up --replace` takes."""
    types = "$".join((CLUSTER_TYPE, NODE_TYPE, NODE_FIREWALL_TYPE, COMMAND_TYPE))
    return f"urn:pulumi:{stack}::{PROJECT}::{types}::{firewall_resource_name(address)}"


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
