"""prometheusTargets with and without the door: the door's HAProxy exporter and one target per
slot router (role router, told apart by `slot`), in place of the single router's."""

from __future__ import annotations

import json
from typing import Any

from components.config import load_cluster_config
from components.render import prometheus_targets
from components.render.prometheus import door_targets
from tests.conftest import stack_values, without_the_door


def router_targets(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in targets if entry["labels"]["role"] in ("router", "door")]


def test_the_door_exporter_and_each_rust_slot_router_are_targets() -> None:
    targets = door_targets("sim-2p2d", "10.231.60.5", 29100, {"b": 29002, "a": 29001}, rust=True)
    assert targets == [
        {"targets": ["10.231.60.5:29100"],
         "labels": {"stack": "sim-2p2d", "role": "door", "node": "10.231.60.5"}},
        {"targets": ["10.231.60.5:29001"],
         "labels": {"stack": "sim-2p2d", "role": "router", "slot": "a", "node": "10.231.60.5"}},
        {"targets": ["10.231.60.5:29002"],
         "labels": {"stack": "sim-2p2d", "role": "router", "slot": "b", "node": "10.231.60.5"}},
    ]
    json.dumps(targets)


def test_minilb_slots_serve_no_metrics_so_only_the_door_is_a_target() -> None:
    assert door_targets("sim", "10.231.60.5", 29100, {"a": 29001, "b": 29002}, rust=False) == [
        {"targets": ["10.231.60.5:29100"],
         "labels": {"stack": "sim", "role": "door", "node": "10.231.60.5"}}]


def test_without_a_door_the_one_rust_router_is_listed_as_before() -> None:
    config = load_cluster_config(without_the_door(stack_values("sim-2p2d")))
    targets = prometheus_targets(config, "sim-2p2d")
    assert router_targets(targets) == [
        {"targets": ["10.231.60.5:29000"],
         "labels": {"stack": "sim-2p2d", "role": "router", "node": "10.231.60.5"}}]
    assert len(targets) == 10


def test_with_a_door_its_targets_replace_the_routers_metrics_port() -> None:
    # sim-2p2d as shipped: the door on two nodes with its default ports (metricsPort 29100,
    # slots a, b): each door node's exporter and the slot that runs there.
    config = load_cluster_config(stack_values("sim-2p2d"))
    assert config.router.door is not None
    targets = prometheus_targets(config, "sim-2p2d")
    without = prometheus_targets(load_cluster_config(without_the_door(stack_values("sim-2p2d"))), "sim-2p2d")
    assert targets[:-4] == without[:-1]  # the master and every rank, unchanged
    assert router_targets(targets) == [
        *door_targets("sim-2p2d", "10.231.60.5", 29100, {"a": 29001}, rust=True),
        *door_targets("sim-2p2d", "10.231.60.7", 29100, {"b": 29002}, rust=True)]
    assert "10.231.60.5:29000" not in {address for entry in targets
                                       for address in entry["targets"]}
    values = stack_values("sim-2p2d")
    values["router"] = {"node": "10.231.60.5", "port": 31000, "kind": "mini-lb",
                        "door": values["router"]["door"]}
    assert router_targets(prometheus_targets(load_cluster_config(values), "sim-2p2d")) == [
        {"targets": [f"{node}:29100"],
         "labels": {"stack": "sim-2p2d", "role": "door", "node": node}}
        for node in ("10.231.60.5", "10.231.60.7")]
    # On one door node: its exporter and both slots there.
    one = stack_values("sim-2p2d")
    one["router"]["door"] = {"image": one["router"]["door"]["image"]}
    assert router_targets(prometheus_targets(load_cluster_config(one), "sim-2p2d")) == (
        door_targets("sim-2p2d", "10.231.60.5", 29100, {"a": 29001, "b": 29002}, rust=True))
