"""Each node's nftables table and the servers' key file, as rendered from the model."""

from __future__ import annotations

import copy
import shutil
import subprocess

import pytest

from components.config import load_cluster_config
from tests.conftest import stack_values
from components.render import (firewall_remove_command, firewall_ruleset, sglang_launch_args,
                               worker_key_file, worker_key_yaml, write_worker_key_command)


def rules(config, address: str) -> list[str]:
    return [line.strip() for line in firewall_ruleset(config, address).splitlines()]


def test_members_reach_every_port_and_others_only_ssh_and_the_door(pro6000: dict) -> None:
    config = load_cluster_config(pro6000)
    router_node = rules(config, "174.1.60.5")
    members = ", ".join(f"174.1.60.{n}" for n in range(1, 9))
    assert f"ip saddr {{ {members} }} accept" in router_node
    assert "tcp dport { 22 } accept" in router_node
    # The door: from anyone, as without a firewall (clientNetworks' default).
    assert "ip saddr { 0.0.0.0/0 } tcp dport 31000 accept" in router_node
    assert "ip6 saddr { ::/0 } tcp dport 31000 accept" in router_node
    # Everything else from a stranger, whatever the port (the run-time ones too).
    assert router_node[-3:] == ["meta l4proto tcp reject with tcp reset", "}", "}"]
    # The door is on the router's node only.
    assert not [line for line in rules(config, "174.1.60.1") if "dport 31000" in line]


def test_the_table_replaces_itself_in_one_transaction(pro6000: dict) -> None:
    script = firewall_ruleset(load_cluster_config(pro6000), "174.1.60.1").splitlines()
    # First what it does, in the words `pulumi preview` shows of a new table (its first lines).
    assert script[0].startswith("# kimipd firewall on 174.1.60.1: every port from 174.1.60.1, ")
    assert script[1] == "# from anyone else only tcp 22 (SSH) from anyone; any other TCP: reset"
    assert script[2:5] == ["table inet kimipd_31000", "delete table inet kimipd_31000",
                           "table inet kimipd_31000 {"]
    assert "type filter hook input priority filter - 10; policy accept;" in script[6]
    assert firewall_remove_command(load_cluster_config(pro6000)) == (
        "if nft list table inet kimipd_31000 >/dev/null 2>&1; then "
        "nft delete table inet kimipd_31000; fi")


def test_monitoring_hosts_reach_the_metrics_ports_of_each_node(pro6000: dict) -> None:
    pro6000["firewall"] = {"monitoringHosts": ["10.9.0.7", "fd00::7"],
                           "operatorHosts": ["10.9.0.1"], "clientNetworks": ["10.20.0.0/16"],
                           "openPorts": [9100]}
    config = load_cluster_config(pro6000)
    master = rules(config, "174.1.60.1")
    assert "ip saddr { 10.9.0.7 } tcp dport { 9003, 30000 } accept" in master
    assert "ip6 saddr { fd00::7 } tcp dport { 9003, 30000 } accept" in master
    assert "ip saddr { 10.9.0.1 } accept" in master
    assert "tcp dport { 9100 } accept" in master
    router_node = rules(config, "174.1.60.5")
    # the door's exporter and its slot's metrics port on each door node (pro6000 ships the
    # door on .5 and .7, slot b on .7)
    assert "ip saddr { 10.9.0.7 } tcp dport { 29001, 29100, 30000 } accept" in router_node
    assert "ip saddr { 10.20.0.0/16 } tcp dport 31000 accept" in router_node
    assert not [line for line in router_node if "::/0" in line]
    other_door_node = rules(config, "174.1.60.7")
    assert ("ip saddr { 10.9.0.7 } tcp dport { 29002, 29100, 30000 } accept"
            in other_door_node)
    assert "ip saddr { 10.20.0.0/16 } tcp dport 31000 accept" in other_door_node
    # On one door node, both slots' metrics ports are router.node's.
    config = load_cluster_config(one_door_node(pro6000))
    assert ("ip saddr { 10.9.0.7 } tcp dport { 29001, 29002, 29100, 30000 } accept"
            in rules(config, "174.1.60.5"))


def one_door_node(values: dict) -> dict:
    """The door on pro6000's router node alone."""
    values["router"]["door"] = {key: value for key, value in values["router"]["door"].items()
                                if key not in ("nodes", "virtualIp")}
    return values


def door_on_two_nodes(values: dict) -> dict:
    """The door on pro6000's router node (174.1.60.5) and 174.1.60.6, its virtual IP between."""
    values["router"]["door"] |= {"nodes": ["174.1.60.5", "174.1.60.6"],
                                 "virtualIp": {"image": "registry.example/keepalived@sha256:"
                                                        + "b" * 64, "address": "174.1.60.100"}}
    return values


def test_vrrp_only_from_the_other_door_node(pro6000: dict) -> None:
    """VRRPv3 has no authentication: the table is what keeps a stranger (or another member)
    from moving the virtual IP. Dropped before the members' accept and the TCP-only reset, which
    would let it through (docs/vrrp-trial.md)."""
    config = load_cluster_config(door_on_two_nodes(pro6000))
    for address, peer in (("174.1.60.5", "174.1.60.6"), ("174.1.60.6", "174.1.60.5")):
        door = rules(config, address)
        assert door[door.index('iif "lo" accept') + 1:][:3] == [
            f"ip saddr {peer} ip protocol vrrp accept", "meta l4proto vrrp drop",
            "ct state established,related accept"]
        members = ", ".join(f"174.1.60.{n}" for n in range(1, 9))
        assert door.index("meta l4proto vrrp drop") < door.index(
            f"ip saddr {{ {members} }} accept")
        # Clients reach the door on either node: the virtual IP lands on both in turn.
        assert "ip saddr { 0.0.0.0/0 } tcp dport 31000 accept" in door
        assert door[1].endswith(f"; any other TCP: reset; VRRP from {peer} (the other door "
                                "node) only")
    # A node without keepalived has no VRRP rule, as before.
    assert not [line for line in rules(config, "174.1.60.1") if "vrrp" in line]


def test_one_door_node_has_no_vrrp_rule(pro6000: dict) -> None:
    router_node = rules(load_cluster_config(one_door_node(pro6000)), "174.1.60.5")
    assert not [line for line in router_node if "vrrp" in line]
    assert router_node[1].endswith("; any other TCP: reset")


def test_a_network_inside_another_of_its_family_is_left_out(pro6000: dict) -> None:
    """nft refuses overlapping intervals in one set: what another listed network holds goes,
    whatever the order, once per network, each family on its own."""
    pro6000["firewall"] = {"clientNetworks": [
        "10.20.0.0/16", "10.0.0.0/8", "10.20.0.0/16", "192.168.1.7", "192.168.1.0/24",
        "192.168.2.7", "fd00:1::/32", "fd00::/8", "2001:db8::1", "2001:db8::/127"]}
    door = rules(load_cluster_config(pro6000), "174.1.60.5")
    assert ("ip saddr { 10.0.0.0/8, 192.168.1.0/24, 192.168.2.7 } tcp dport 31000 accept"
            in door)
    assert "ip6 saddr { fd00::/8, 2001:db8::/127 } tcp dport 31000 accept" in door


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft (Debian nftables) not installed")
def test_nft_accepts_every_rendered_table(pro6000: dict) -> None:
    """`nft -c` parses the script as the node's nft would, without touching this machine."""
    pro6000["firewall"] = {"monitoringHosts": ["10.9.0.7", "fd00::7", "10.9.0.0/24"],
                           "clientNetworks": ["0.0.0.0/0", "10.0.0.0/8", "::/0"],
                           "openPorts": [9100]}
    # A network inside another of the list is left out: nft refuses conflicting intervals.
    door = rules(load_cluster_config(pro6000), "174.1.60.5")
    assert "ip saddr { 0.0.0.0/0 } tcp dport 31000 accept" in door
    assert "ip saddr { 10.9.0.0/24 } tcp dport { 29001, 29100, 30000 } accept" in door
    sim_2p2d = stack_values("sim-2p2d") | {"image": "10.231.60.254:5000/kimipd/sim-node@sha256:"
                                           + "a" * 64}
    for values in (pro6000, door_on_two_nodes(copy.deepcopy(pro6000)),
                   one_door_node(copy.deepcopy(pro6000)), sim_2p2d):
        config = load_cluster_config(values)
        for node in config.nodes:
            check = subprocess.run(["nft", "-c", "-f", "-"], capture_output=True, text=True,
                                   input=firewall_ruleset(config, node.address), check=False)
            assert check.returncode == 0, f"{node.address}: {check.stderr}"


def test_keyed_servers_read_the_key_from_a_file(pro6000: dict) -> None:
    config = load_cluster_config(pro6000)
    argv = sglang_launch_args(config, "decode", 2)
    assert argv[argv.index("--config") + 1] == worker_key_file(config)
    assert not [arg for arg in argv if arg.startswith("--api-key")]
    # A JSON string is a YAML string: any character of the key survives.
    assert worker_key_yaml('k:#"1') == 'api-key: "k:#\\"1"\n'
    assert worker_key_yaml("k", "admin\n") == 'api-key: "k"\nadmin-api-key: "admin"\n'
    assert write_worker_key_command(config).startswith("umask 077 && ")


def test_minilb_servers_have_no_key(pro6000: dict) -> None:
    pro6000["router"]["kind"] = "mini-lb"
    config = load_cluster_config(pro6000)
    assert "--config" not in sglang_launch_args(config, "prefill", 0)
