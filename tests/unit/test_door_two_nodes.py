"""The door on two nodes, as rendered: a door on each, slot a on router.node and slot b on the
other door node, each door sending to both slots at their nodes."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from components.config import ClusterConfig, ConfigError, load_cluster_config
from components.render import (door_haproxy_config, door_plan, drain_command, firewall_ruleset,
                               keepalived_config,
                               preflight_command, prometheus_targets, restore_command,
                               router_command, router_plan, slot_admit_command,
                               slot_drain_command, slot_url)
from tests.conftest import asset_script

ROUTER_NODE, OTHER = "174.1.60.5", "174.1.60.6"
KEEPALIVED_IMAGE = "registry.example/kimipd/keepalived@sha256:" + "b" * 64


@pytest.fixture
def cfg(pro6000: dict) -> ClusterConfig:
    pro6000["router"]["door"] |= {"nodes": [ROUTER_NODE, OTHER], "virtualIp": {
        "image": KEEPALIVED_IMAGE, "address": "174.1.60.100"}}
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
    assert "    server slot-a 174.1.60.5:31001 check port 31101" in haproxy
    assert "    server slot-b 174.1.60.6:31002 check port 31102" in haproxy
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
    assert cfg.roles_of(ROUTER_NODE)[-3:] == ["door", "router-a", "keepalived"]
    assert cfg.roles_of(OTHER)[-3:] == ["door-174-1-60-6", "router-b", "keepalived-174-1-60-6"]
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
    pro6000["router"]["door"] |= {"nodes": [ROUTER_NODE, OTHER], "virtualIp": {
        "image": KEEPALIVED_IMAGE, "address": "174.1.60.100"}}
    with pytest.raises(Exception, match="31002 on 174.1.60.6 is already used"):
        load_cluster_config(pro6000)


def two_decode_groups(pro6000: dict) -> dict:
    """pro6000 with its decode group split in two (4 GPUs of 8 each would do for a test), so
    that the other door node can go out with one of them."""
    decode = pro6000["groups"]["decode"] | {"tpSize": 16, "epSize": 16}
    pro6000["groups"]["decode"] = decode | {"nodes": [ROUTER_NODE, "174.1.60.7"]}
    pro6000["groups"]["decode-b"] = decode | {"nodes": [OTHER, "174.1.60.8"]}
    pro6000["router"]["door"] |= {"nodes": [ROUTER_NODE, OTHER], "virtualIp": {
        "image": KEEPALIVED_IMAGE, "address": "174.1.60.100"}}
    return pro6000


def taken_out(raw: dict, address: str) -> ClusterConfig:
    index = next(i for i, node in enumerate(raw["nodes"]) if node["address"] == address)
    raw["nodes"][index]["out"] = True
    return load_cluster_config(raw).in_service()


def test_with_the_other_door_node_out_router_node_carries_the_door_alone(pro6000: dict) -> None:
    raw = two_decode_groups(pro6000)
    both = load_cluster_config(raw)
    out = taken_out(raw, OTHER)
    assert out.door_nodes == out.virtual_ip_nodes == [ROUTER_NODE]
    # Slot b stands in on router.node, at its own ports: the door keeps two slots.
    assert (out.slot_node("a"), out.slot_node("b")) == (ROUTER_NODE, ROUTER_NODE)
    assert router_plan(out, "b").node == ROUTER_NODE
    assert "    server slot-b 174.1.60.5:31002 check port 31102" in door_haproxy_config(out).splitlines()
    assert "--router http://127.0.0.1:31002" in restore_command(out, "b")
    assert {31001, 31002} <= set(out.ports_on(ROUTER_NODE))
    assert out.roles_of(ROUTER_NODE)[-4:] == ["door", "router-a", "router-b", "keepalived"]
    assert out.roles_of(OTHER) == []
    assert OTHER not in {target["labels"]["node"] for target in prometheus_targets(out, "s")}
    # keepalived and the firewall on router.node are untouched: the same peer, nothing
    # reloaded when the other node goes out or comes back.
    assert keepalived_config(out, ROUTER_NODE) == keepalived_config(both, ROUTER_NODE)
    assert firewall_ruleset(out, ROUTER_NODE) == firewall_ruleset(both, ROUTER_NODE)


def test_slot_b_standing_in_on_router_node_needs_its_ports_free_there(pro6000: dict) -> None:
    # Apart, the two slots may share ports; on router.node they cannot.
    raw = two_decode_groups(pro6000)
    raw["router"]["door"]["slots"] = [{"port": 31001, "metricsPort": 29001},
                                      {"port": 31001, "metricsPort": 29002}]
    load_cluster_config(raw)
    with pytest.raises(ConfigError) as refused:
        taken_out(raw, OTHER)
    assert "router.door.slots[1].port: 31001 on 174.1.60.5 is already used by " \
           "router.door.slots[0].port" in str(refused.value)


def test_router_node_cannot_be_taken_out(pro6000: dict) -> None:
    pro6000["router"]["door"] |= {"nodes": [ROUTER_NODE, OTHER], "virtualIp": {
        "image": KEEPALIVED_IMAGE, "address": "174.1.60.100"}}
    index = next(i for i, node in enumerate(pro6000["nodes"])
                 if node["address"] == ROUTER_NODE)
    pro6000["nodes"][index]["out"] = True
    with pytest.raises(ConfigError) as refused:
        load_cluster_config(pro6000)
    assert f"nodes[{index}].out: '174.1.60.5' holds the router (router.node)" in str(
        refused.value)


def test_each_door_must_bind_every_address_for_the_virtual_ip(pro6000: dict) -> None:
    pro6000["router"]["door"] |= {"nodes": [ROUTER_NODE, OTHER], "virtualIp": {
        "image": KEEPALIVED_IMAGE, "address": "174.1.60.100"}}
    pro6000["router"]["host"] = ROUTER_NODE
    with pytest.raises(ConfigError) as refused:
        load_cluster_config(pro6000)
    assert "router.host: '174.1.60.5' is where each door binds router.port" in str(refused.value)


def test_the_scripts_on_router_node_reach_slot_b_at_its_node(cfg: ClusterConfig) -> None:
    assert ("--router http://127.0.0.1:31001 --slot slot-a --router http://174.1.60.6:31002 "
            "--slot slot-b") in drain_command(cfg, next(iter(cfg.groups)))
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


def test_preflight_asks_for_python3_on_both_door_nodes(cfg: ClusterConfig) -> None:
    """door-slots.py runs on the other door node too (its door's drain and admission)."""
    for address in (ROUTER_NODE, OTHER):
        assert "--needs-python yes" in preflight_command(cfg, address, ""), address
    assert "--needs-python" not in preflight_command(cfg, "174.1.60.7", "")


def door_slots() -> ModuleType:
    """assets/door-slots.py as a module (it imports router_api.py beside it)."""
    return asset_script("door-slots.py")


class FakeDoor:
    """The runtime API as door-slots.py reads it: a drain ends the slot's open requests, ready
    makes it UP."""

    def __init__(self, rows: dict[str, dict[str, str]] | None) -> None:
        self.rows, self.said = rows, []

    def servers(self) -> dict[str, dict[str, str]] | None:
        return self.rows

    def set_state(self, server: str, state: str) -> None:
        assert self.rows is not None
        self.said.append((server, state))
        self.rows[server] = {"status": "DRAIN", "scur": "0"} if state == "drain" else {
            "status": "UP", "scur": "0"}


class FakeRouter:
    def __init__(self, answers: list[int]) -> None:
        self.url, self.answers, self.asked = "http://174.1.60.6:31002", answers, []

    def call(self, method: str, path: str) -> tuple[int, None]:
        self.asked.append((method, path))
        return (self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]), None


def test_the_other_doors_drain_sets_drain_there_and_asks_no_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    module = door_slots()
    door = FakeDoor({"slot-a": {"status": "UP", "scur": "0"},
                     "slot-b": {"status": "UP", "scur": "3"}})
    monkeypatch.setattr(module, "Door", lambda _path: door)
    args = argparse.Namespace(door_socket="/x", slot="b", drain_timeout=5, interval=0.01)
    assert module.door_drain(args) == 0
    assert door.said == [("slot-b", "drain")]
    # A door that does not answer (not there yet, being replaced): nothing to drain.
    gone = FakeDoor(None)
    monkeypatch.setattr(module, "Door", lambda _path: gone)
    assert module.door_drain(args) == 0 and gone.said == []


@pytest.mark.parametrize("mini_lb, path", [(False, "/readiness"), (True, "/health")])
def test_the_other_doors_admission_waits_until_the_slot_serves(
        monkeypatch: pytest.MonkeyPatch, mini_lb: bool, path: str) -> None:
    module = door_slots()
    door = FakeDoor({"slot-b": {"status": "MAINT", "scur": "0"}})
    monkeypatch.setattr(module, "Door", lambda _path: door)
    router = FakeRouter([503, 503, 200])
    args = argparse.Namespace(door_socket="/x", slot="b", mini_lb=mini_lb, timeout=5,
                              interval=0.01)
    assert module.door_admit(args, router) == 0
    assert router.asked == [("GET", path)] * 3
    assert door.said == [("slot-b", "ready")]
