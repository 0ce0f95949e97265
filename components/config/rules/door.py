"""The door on two nodes: which nodes, and the virtual IP that moves between them."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


def door_nodes_are_members(cfg: ClusterConfig) -> Iterable[str]:
    door = cfg.router.door
    if door is None:
        return
    if door.nodes is None:
        if door.virtual_ip is not None:
            yield (f"router.door.virtualIp: {door.virtual_ip.address!r} is set but "
                   "router.door.nodes is not, and a virtual IP moves between two door nodes: "
                   f"set router.door.nodes to [{cfg.router.node}, another member], or remove "
                   "router.door.virtualIp.")
        return
    if door.virtual_ip is None:
        yield (f"router.door.nodes: {door.nodes!r} puts the door on two nodes, but "
               "router.door.virtualIp is not set, so clients would have no address that follows "
               "the one serving: set router.door.virtualIp.address to a free address on their "
               "network, or remove router.door.nodes.")
    known = {node.address for node in cfg.nodes}
    for index, address in enumerate(door.nodes):
        if address not in known:
            yield (f"router.door.nodes[{index}]: {address!r} is not a declared node; add it to "
                   f"`nodes` or use one of {', '.join(sorted(known))}.")
    if cfg.router.host != "0.0.0.0":
        yield (f"router.host: {cfg.router.host!r} is where each door binds router.port, and with "
               "the door on two nodes clients come through router.door.virtualIp, which only "
               "the node holding it has: remove router.host (default 0.0.0.0), so that both "
               "doors answer on the virtual IP as well as on their own address.")
    first, second = door.nodes
    if first == second:
        yield (f"router.door.nodes[1]: {second!r} is router.door.nodes[0] too; name two "
               "different nodes, router.node and one more, so that losing one leaves the other.")
    elif cfg.router.node not in door.nodes:
        yield (f"router.door.nodes: {door.nodes!r} leaves out router.node {cfg.router.node!r}, "
               "where the door stands today: list router.node and one more member, e.g. "
               f"[{cfg.router.node}, {first}].")


def virtual_ip_is_free(cfg: ClusterConfig) -> Iterable[str]:
    """The address belongs to no node, and a mask shorter than /32 holds both door nodes."""
    door = cfg.router.door
    if door is None or door.virtual_ip is None:
        return
    vip = door.virtual_ip
    for index, node in enumerate(cfg.nodes):
        if node.address == vip.address:
            yield (f"router.door.virtualIp.address: {vip.address!r} is nodes[{index}]'s own "
                   "address; the virtual IP is added to whichever door node holds it and taken "
                   "away from the other, so it must be no node's: pick a free address on the "
                   "door nodes' network.")
    if vip.prefix_length == 32:
        return
    network = ipaddress.IPv4Network(f"{vip.address}/{vip.prefix_length}", strict=False)
    if vip.prefix_length < 31 and ipaddress.IPv4Address(vip.address) in (
            network.network_address, network.broadcast_address):
        yield (f"router.door.virtualIp.address: {vip.address!r} is the network or broadcast "
               f"address of {network} (prefixLength {vip.prefix_length}); pick a host address "
               "inside it.")
    for index, address in enumerate(door.nodes or []):
        if address in (door.nodes or [])[:index]:
            continue
        if ipaddress.IPv4Address(address) not in network:
            yield (f"router.door.virtualIp.prefixLength: {vip.prefix_length} puts "
                   f"{vip.address} in {network}, which does not hold router.door.nodes[{index}] "
                   f"{address!r}; the address and its gratuitous ARP must be on the door nodes' "
                   "own network: use that network's prefix length, or 32.")


def client_keys_need_the_rust_router(cfg: ClusterConfig) -> Iterable[str]:
    door = cfg.router.door
    if door is None or not door.client_keys or cfg.router.kind == "rust":
        return
    yield (f"router.door.clientKeys: {', '.join(sorted(door.client_keys))} set with router.kind "
           f"{cfg.router.kind!r}: the door swaps a client's key for the internal key "
           "routerApiKey, which only the rust router and its servers check; MiniLB checks no "
           "key. Set router.kind: rust (and the secret routerApiKey), or remove clientKeys.")
