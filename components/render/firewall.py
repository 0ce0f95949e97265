"""Each node's firewall: one nftables table the program owns, rendered from the model.

The table accepts everything from the cluster's members and the operator's hosts, and from
anyone else only SSH, the router's port (from `firewall.clientNetworks`), the metrics ports (from
`firewall.monitoringHosts`) and `firewall.openPorts`; any other TCP connection is refused with a
reset. It decides by source, not by a list of serving ports: NCCL, Gloo, the KV transfer and
SGLang's ZMQ sockets pick ports at run time that no list could name. UDP is left alone (nothing
here serves on it; DHCP and the node's own services do). On the two door nodes of a virtual IP,
VRRP (IP protocol 112, which the TCP reset never touches) is accepted from the other door node
only and dropped from anyone else, members included: VRRPv3 has no authentication, so this is
what keeps a stranger from moving the address (docs/vrrp-trial.md). The table is the program's
own (`inet kimipd_PORT`, by router port like the router's state directory): no other table, chain
or rule on the node is read or changed (docs/decisions.md).
"""

from __future__ import annotations

import functools
import ipaddress

from ..config import ClusterConfig
from .layout import shell


def firewall_table(cfg: ClusterConfig) -> str:
    return f"kimipd_{cfg.router.port}"


def _by_family(networks: list[str]) -> tuple[list[str], list[str]]:
    """Each family's networks, those inside another one left out (nft refuses overlapping
    intervals in one set), in the order given; a host as its address (as nft lists it back), a
    network as a prefix."""
    parsed = list(dict.fromkeys(ipaddress.ip_network(network, strict=False)
                                for network in networks))
    listed = set(parsed)
    prefix_lengths: dict[int, set[int]] = {4: set(), 6: set()}
    for network in parsed:
        prefix_lengths[network.version].add(network.prefixlen)
    families: tuple[list[str], list[str]] = ([], [])
    for network in parsed:
        # Inside another listed network exactly when its supernet at one of the shorter listed
        # lengths of its family is listed: a lookup per length, not a comparison with every
        # other network (every node's table lists every member: issue 29).
        if any(network.supernet(new_prefix=length) in listed
               for length in prefix_lengths[network.version] if length < network.prefixlen):
            continue
        shown = (str(network.network_address) if network.prefixlen == network.max_prefixlen
                 else str(network))
        families[0 if network.version == 4 else 1].append(shown)
    return families


def _elements(items: list[str] | list[int]) -> str:
    return "{ " + ", ".join(str(item) for item in items) + " }"


@functools.lru_cache(maxsize=64)
def _from(networks: tuple[str, ...], what: str) -> tuple[str, ...]:
    """`ip saddr {..} WHAT` / `ip6 saddr {..} WHAT` for the non-empty families. Cached: every
    node's table has the same member rule, worked out once instead of once per node (issue 29)."""
    v4, v6 = _by_family(list(networks))
    rules = []
    if v4:
        rules.append(f"ip saddr {_elements(v4)} {what}")
    if v6:
        rules.append(f"ip6 saddr {_elements(v6)} {what}")
    return tuple(rules)


@functools.lru_cache(maxsize=64)
def _in_address_order(addresses: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(addresses, key=ipaddress.ip_address))


def _summary(cfg: ClusterConfig, address: str, members: tuple[str, ...],
             ssh_ports: list[int]) -> list[str]:
    """Two comment lines that say what the table does: `pulumi preview` shows a new multi-line
    value by its first lines only."""
    spec = cfg.firewall
    others = [f"tcp {','.join(map(str, ssh_ports))} (SSH) from anyone"]
    if address in _router_port_nodes(cfg):
        others.append(f"{cfg.router.port} (router) from {', '.join(spec.client_networks)}")
    metrics = cfg.metrics_ports_on(address)
    if metrics and spec.monitoring_hosts:
        others.append(f"{','.join(map(str, metrics))} (metrics) from "
                      f"{', '.join(spec.monitoring_hosts)}")
    if spec.open_ports:
        others.append(f"{','.join(map(str, sorted(set(spec.open_ports))))} (openPorts) "
                      "from anyone")
    trusted = [*members, *spec.operator_hosts]
    peer = cfg.door_peer(address)
    vrrp = f"; VRRP from {peer} (the other door node) only" if peer is not None else ""
    return [f"# kimipd firewall on {address}: every port from {', '.join(trusted)}",
            f"# from anyone else only {'; '.join(others)}; any other TCP: reset{vrrp}"]


def _router_port_nodes(cfg: ClusterConfig) -> list[str]:
    """Where clients reach router.port: the door's nodes (the virtual IP lands on either), or
    the router's."""
    return cfg.door_nodes or [cfg.router.node]


def _vrrp_rules(peer: str | None) -> list[str]:
    """The virtual IP's guard: VRRP from the other door node, and from nobody else. Before the
    members' accept: another member's adverts would move the address as well as a stranger's."""
    if peer is None:
        return []
    return [f"ip saddr {peer} ip protocol vrrp accept", "meta l4proto vrrp drop"]


def firewall_ruleset(cfg: ClusterConfig, address: str) -> str:
    """The nft script for one node: replaces the program's table in one transaction (the first
    line creates it when absent, so the delete always has something to delete)."""
    spec = cfg.firewall
    table = f"inet {firewall_table(cfg)}"
    members = _in_address_order(frozenset(node.address for node in cfg.nodes))
    ssh_ports = sorted({node.ssh_port for node in cfg.nodes})
    rules = [
        'iif "lo" accept',
        *_vrrp_rules(cfg.door_peer(address)),
        "ct state established,related accept",
        "meta l4proto { icmp, ipv6-icmp } accept",
        # Members: every port, including those picked at run time.
        *_from(members, "accept"),
        *_from(tuple(spec.operator_hosts), "accept"),
        # Never closed: the program and the operator reach the nodes over it.
        f"tcp dport {_elements(ssh_ports)} accept",
    ]
    if address in _router_port_nodes(cfg):
        rules += _from(tuple(spec.client_networks), f"tcp dport {cfg.router.port} accept")
    metrics_ports = cfg.metrics_ports_on(address)
    if metrics_ports:
        rules += _from(tuple(spec.monitoring_hosts),
                       f"tcp dport {_elements(metrics_ports)} accept")
    if spec.open_ports:
        rules.append(f"tcp dport {_elements(sorted(set(spec.open_ports)))} accept")
    # A reset, not a silent drop: a stranger learns nothing more, and a tool that tries a direct
    # connection before SSH (kimipd status) falls back at once instead of after a timeout.
    rules.append("meta l4proto tcp reject with tcp reset")
    body = "\n".join(f"    {rule}" for rule in rules)
    return ("\n".join(_summary(cfg, address, members, ssh_ports)) + "\n"
            f"table {table}\n"
            f"delete table {table}\n"
            f"table {table} {{\n"
            "  chain input {\n"
            # Before the usual filter chains (priority 0): a node's own accept rules in
            # another table cannot open what this table refuses, nor this table theirs.
            "    type filter hook input priority filter - 10; policy accept;\n"
            f"{body}\n"
            "  }\n"
            "}\n")


def firewall_apply_command(cfg: ClusterConfig) -> str:
    """Checks the script on stdin, then applies it (`nft -c` first: a refused script changes
    nothing, and says why)."""
    return ("set -e; rules=$(cat); "
            'printf "%s\\n" "$rules" | nft -c -f - && printf "%s\\n" "$rules" | nft -f - && '
            f"nft list table inet {firewall_table(cfg)} >/dev/null")


def firewall_remove_command(cfg: ClusterConfig) -> str:
    table = shell([f"{firewall_table(cfg)}"])
    return (f"if nft list table inet {table} >/dev/null 2>&1; then "
            f"nft delete table inet {table}; fi")
