"""The door on two nodes, as rendered: a door on each, slot a on router.node and slot b on the
other door node, each door sending to both slots at their nodes."""

from __future__ import annotations

import pytest

from components.config import ClusterConfig, load_cluster_config
from components.render import (door_haproxy_config, door_plan, drain_command, firewall_ruleset,
                               prometheus_targets, restore_command, router_command, router_plan,
                               slot_admit_command, slot_drain_command, slot_url)

ROUTER_NODE, OTHER = "174.1.60.5", "174.1.60.6"


@pytest.fixture
def cfg(pro6000: dict) -> ClusterConfig:
    pro6000["router"]["door"] |= {"nodes": [ROUTER_NODE, OTHER],
                                  "virtualIp": {"address": "174.1.60.100"}}
    return load_cluster_config(pro6000)


def test_slot_a_stays_on_router_node_and_slot_b_moves_to_the_other(cfg: ClusterConfig) -> None:
    assert (cfg.slot_node("a"), cfg.slot_node("b")) == (ROUTER_NODE, OTHER)
    for slot, node, port in (("a", ROUTER_NODE, "31001"), ("b", OTHER, "31002")):
        plan = router_plan(cfg, slot)
        assert (plan.node, plan.name) == (node, f"kimipd-router-{slot}")
        assert plan.health_url == f"http://{node}:{port}/health"
        assert slot_url(cfg, slot) == f"http://{node}:{port}"
        # The same ports as on one node: only where it runs changes.
        argv = router_command(cfg, slot)
        assert argv[argv.index("--port") + 1] == port


def test_each_door_sends_to_both_slots_at_their_nodes(cfg: ClusterConfig) -> None:
    haproxy = door_haproxy_config(cfg).splitlines()
    assert "    server slot-a 174.1.60.5:31001 check" in haproxy
    assert "    server slot-b 174.1.60.6:31002 check" in haproxy
    assert not [line for line in haproxy if "127.0.0.1" in line]


def test_a_door_on_each_door_node_named_by_its_node_off_router_node(cfg: ClusterConfig) -> None:
    here, there = door_plan(cfg, ROUTER_NODE), door_plan(cfg, OTHER)
    assert door_plan(cfg) == here
    assert (here.role, here.node, here.name) == ("door", ROUTER_NODE, "kimipd-door")
    assert (there.role, there.node, there.name) == ("door-174-1-60-6", OTHER, "kimipd-door")
    assert there.labels == {"kimipd.role": "door-174-1-60-6"}
    assert there.health_url == f"http://{OTHER}:29100/health"
    assert (there.command, there.mounts, there.entrypoint, there.stop_signal, there.user) == (
        here.command, here.mounts, here.entrypoint, here.stop_signal, here.user)


def test_roles_ports_and_metrics_follow_the_door_and_the_slot(cfg: ClusterConfig) -> None:
    assert cfg.roles_of(ROUTER_NODE)[-2:] == ["door", "router-a"]
    assert cfg.roles_of(OTHER)[-2:] == ["door-174-1-60-6", "router-b"]
    other_ports = cfg.ports_on(OTHER)
    assert {port: other_ports[port] for port in (31000, 29100, 31002, 29002)} == {
        31000: "router.port", 29100: "router.door.metricsPort",
        31002: "router.door.slots[1].port", 29002: "router.door.slots[1].metricsPort"}
    assert 31002 not in cfg.ports_on(ROUTER_NODE)
    assert {29100, 29002} <= set(cfg.metrics_ports_on(OTHER))
    assert 29002 not in cfg.metrics_ports_on(ROUTER_NODE)
    # Clients reach router.port on either door node (the virtual IP lands on either).
    assert "tcp dport 31000 accept" in firewall_ruleset(cfg, OTHER)


def test_a_port_of_the_other_door_node_that_collides_is_refused(pro6000: dict) -> None:
    decode = next(name for name, group in pro6000["groups"].items() if OTHER in group["nodes"])
    pro6000["groups"][decode]["httpPort"] = 31002
    pro6000["router"]["door"] |= {"nodes": [ROUTER_NODE, OTHER],
                                  "virtualIp": {"address": "174.1.60.100"}}
    with pytest.raises(Exception, match="31002 on 174.1.60.6 is already used"):
        load_cluster_config(pro6000)


def test_the_scripts_on_router_node_reach_slot_b_at_its_node(cfg: ClusterConfig) -> None:
    assert "--router http://127.0.0.1:31001 --router http://174.1.60.6:31002" in drain_command(
        cfg, next(iter(cfg.groups)))
    assert "--router http://174.1.60.6:31002" in restore_command(cfg, "b")
    assert "--router http://174.1.60.6:31002" in slot_admit_command(cfg, "b")
    assert "--router" not in slot_drain_command(cfg, "b")


def test_each_door_node_is_scraped_for_its_door_and_its_slot(cfg: ClusterConfig) -> None:
    cfg = cfg.model_copy(update={"metrics": cfg.metrics.model_copy(update={"enabled": True})})
    door = [(t["labels"]["role"], t["labels"].get("slot"), t["targets"])
            for t in prometheus_targets(cfg, "pro6000") if t["labels"]["role"] in
            ("door", "router")]
    assert door == [("door", None, [f"{ROUTER_NODE}:29100"]),
                    ("router", "a", [f"{ROUTER_NODE}:29001"]),
                    ("door", None, [f"{OTHER}:29100"]),
                    ("router", "b", [f"{OTHER}:29002"])]
