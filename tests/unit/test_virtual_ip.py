"""The door on two nodes: its virtual IP in the model."""

from __future__ import annotations

import copy
import pytest

from components.config import ConfigError, load_cluster_config

VIP = "174.1.60.100"


@pytest.fixture
def pro6000(pro6000: dict) -> dict:
    """pro6000 with the door on its router node (174.1.60.5) and 174.1.60.6."""
    pro6000["router"]["door"] |= {"nodes": ["174.1.60.5", "174.1.60.6"],
                                  "virtualIp": {"address": VIP}}
    return pro6000


def refusal(values: dict, **door) -> str:
    values = copy.deepcopy(values)
    values["router"]["door"] |= door
    with pytest.raises(ConfigError) as refused:
        load_cluster_config(values)
    return str(refused.value)


def test_the_door_stands_on_two_nodes_each_the_others_only_peer(pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    assert cfg.door_nodes == ["174.1.60.5", "174.1.60.6"]
    assert cfg.door_peer("174.1.60.5") == "174.1.60.6"
    assert cfg.door_peer("174.1.60.6") == "174.1.60.5"
    assert cfg.door_peer("174.1.60.1") is None
    vip = cfg.router.door.virtual_ip if cfg.router.door else None
    assert vip is not None
    # The defaults: sub-second adverts, the compute interface, a /32 that adds no route.
    assert (vip.advert_interval_ms, vip.interface, vip.prefix_length, vip.vrid) == (
        100, None, 32, 51)


def test_one_door_node_is_as_before() -> None:
    from tests.conftest import stack_values

    cfg = load_cluster_config(stack_values("pro6000"))
    assert cfg.door_nodes == ["174.1.60.5"]
    assert cfg.door_peer("174.1.60.5") is None


def test_nodes_and_virtual_ip_come_together(pro6000: dict) -> None:
    alone = copy.deepcopy(pro6000)
    del alone["router"]["door"]["virtualIp"]
    assert ("router.door.nodes: ['174.1.60.5', '174.1.60.6'] puts the door on two nodes, but "
            "router.door.virtualIp is not set") in refusal(alone)
    alone = copy.deepcopy(pro6000)
    del alone["router"]["door"]["nodes"]
    assert ("router.door.virtualIp: '174.1.60.100' is set but router.door.nodes is not"
            in refusal(alone))
    assert "router.door.nodes: ['174.1.60.5'] has 1 item(s)" in refusal(
        pro6000, nodes=["174.1.60.5"])


def test_door_nodes_are_two_members_one_of_them_the_router_node(pro6000: dict) -> None:
    message = refusal(pro6000, nodes=["174.1.60.5", "174.1.60.9"])
    assert ("router.door.nodes[1]: '174.1.60.9' is not a declared node; add it to `nodes` or "
            "use one of 174.1.60.1,") in message
    message = refusal(pro6000, nodes=["174.1.60.5", "174.1.60.5"])
    assert "router.door.nodes[1]: '174.1.60.5' is router.door.nodes[0] too" in message
    message = refusal(pro6000, nodes=["174.1.60.6", "174.1.60.7"])
    assert ("router.door.nodes: ['174.1.60.6', '174.1.60.7'] leaves out router.node "
            "'174.1.60.5'") in message
    assert "e.g. [174.1.60.5, 174.1.60.6]" in message


def test_the_virtual_ip_is_no_nodes_own_and_on_the_door_nodes_network(pro6000: dict) -> None:
    message = refusal(pro6000, virtualIp={"address": "174.1.60.3"})
    assert "router.door.virtualIp.address: '174.1.60.3' is nodes[2]'s own address" in message
    assert "pick a free address on the door nodes' network" in message
    message = refusal(pro6000, virtualIp={"address": "174.1.61.100", "prefixLength": 24})
    assert ("router.door.virtualIp.prefixLength: 24 puts 174.1.61.100 in 174.1.61.0/24, which "
            "does not hold router.door.nodes[0] '174.1.60.5'") in message
    message = refusal(pro6000, virtualIp={"address": "174.1.60.255", "prefixLength": 24})
    assert "'174.1.60.255' is the network or broadcast address of 174.1.60.0/24" in message
    # Inside the nodes' network with its mask: accepted.
    pro6000["router"]["door"]["virtualIp"] = {"address": VIP, "prefixLength": 24}
    load_cluster_config(pro6000)


def test_a_virtual_ip_value_keepalived_would_refuse_is_refused_by_its_key(pro6000: dict) -> None:
    message = refusal(pro6000, virtualIp={"address": "door.example"})
    assert ("router.door.virtualIp.address: 'door.example' is not an IPv4 address; write a free "
            "address on the door nodes' network, e.g. 174.1.60.100") in message
    message = refusal(pro6000, virtualIp={"address": VIP, "advertIntervalMs": 105})
    assert ("router.door.virtualIp.advertIntervalMs: 105 ms is not a whole number of "
            "centiseconds, the unit VRRPv3 carries; write 100") in message
    message = refusal(pro6000, virtualIp={"address": VIP, "interface": "bond1:0"})
    assert "router.door.virtualIp.interface: 'bond1:0' is not a network interface name" in message
    message = refusal(pro6000, virtualIp={"address": VIP, "vrid": 256})
    assert "router.door.virtualIp.vrid: 256" in message
    message = refusal(pro6000, virtualIp={"address": VIP, "advertInterval": 100})
    assert "router.door.virtualIp.advertInterval: unknown key" in message
