"""pro6000 as it ships, under Pulumi's mocks: every SGLang server keyed with the router's key from
a root-only file, every node behind its own firewall before any container starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import stack_values
from tests.program.harness import (
    ROUTER_API_KEY, SECRET_SIG, SIG_KEY, Run, host_key_of, run_program, with_local_files)

pytestmark = pytest.mark.timeout(120)  # the SDK's threads can hang under mocks (pulumi#7663)

NODES = [f"174.1.60.{i}" for i in range(1, 9)]


@pytest.fixture
def values(tmp_path: Path) -> dict:
    return with_local_files(stack_values("pro6000"), tmp_path)


@pytest.fixture
def run(values: dict) -> Run:
    return run_program(values)


def node_name(address: str) -> str:
    return "node-" + address.replace(".", "-")


def test_pro6000_ships_the_keyed_rust_router(run: Run) -> None:
    # Behind the door: two slots, each the keyed rust router.
    for slot in ("router-a", "router-b"):
        router = run.containers()[slot]
        assert any(word.endswith("/router-launch.py") for word in router.inputs["command"]), slot
    assert run.stack_outputs["routerApiKey"] == ROUTER_API_KEY


def test_every_server_reads_the_key_from_its_nodes_file(run: Run) -> None:
    for role, container in run.containers().items():
        if role == "mooncake-master" or role.startswith(("door", "router-", "keepalived")):
            continue
        command = container.inputs["command"]
        assert command[command.index("--config") + 1] == "/opt/kimipd/keys-31000/sglang.yaml"
        node = next(a for a in NODES if f"--node-rank" in command and a in json.dumps(
            container.inputs["envs"]) and f"SGLANG_HOST_IP={a}" in container.inputs["envs"])
        key_file = run.named(f"{node_name(node)}-sglang-api-key")
        assert run.waits_for(container, key_file), role
        # A new key is a new file, whose id restarts the rank with it.
        labels = {label["label"]: label["value"] for label in container.inputs["labels"]}
        assert labels["kimipd.api-key-file"] == f"{node_name(node)}-sglang-api-key-id", role


def test_the_key_travels_as_a_secret_on_stdin_only(run: Run) -> None:
    key_files = [r for r in run.resources if r.name.endswith("-sglang-api-key")]
    assert len(key_files) == 8
    for key_file in key_files:
        assert key_file.raw_inputs["stdin"].get(SIG_KEY) == SECRET_SIG
        assert key_file.delete_before_replace
        assert key_file.inputs["create"].startswith("umask 077 && ")
    for resource in run.resources:
        assert all(trigger.get(SIG_KEY) == SECRET_SIG
                   for trigger in resource.raw_inputs.get("triggers", [])
                   if resource in key_files)
        for name in ("create", "update", "delete", "command", "envs", "labels"):
            assert ROUTER_API_KEY not in json.dumps(resource.inputs.get(name, "")), resource.name


def test_every_node_has_a_firewall_before_any_container(run: Run) -> None:
    containers = run.containers()
    for address in NODES:
        rules = run.named(f"{node_name(address)}-nftables")
        assert rules.inputs["create"] == rules.inputs["update"]
        assert rules.delete_before_replace  # a replacement's delete removes the table
        assert rules.inputs["delete"].endswith("nft delete table inet kimipd_31000; fi")
        assert "\ntable inet kimipd_31000\n" in rules.inputs["stdin"]
        assert run.waits_for(rules, run.named(f"{node_name(address)}-preflight"))
        for role, container in containers.items():
            if f"SGLANG_HOST_IP={address}" in container.inputs.get("envs", []) or (
                    role == "router" and address == "174.1.60.5"):
                assert run.waits_for(container, rules), (role, address)


def test_a_new_member_updates_every_table_in_place(values: dict) -> None:
    before = run_program(values).named("node-174-1-60-1-nftables").inputs["stdin"]
    values["nodes"].append({"address": "174.1.60.9", "gpus": 0,
                            "hostKey": host_key_of("174.1.60.9")})
    values["router"]["node"] = "174.1.60.9"
    values["router"]["door"]["nodes"] = ["174.1.60.9", "174.1.60.7"]
    after = run_program(values)
    rules = after.named("node-174-1-60-1-nftables").inputs["stdin"]
    assert rules != before and "174.1.60.9" in rules
    assert "dport 31000" in after.named("node-174-1-60-9-nftables").inputs["stdin"]
    assert "dport 31000" not in after.named("node-174-1-60-5-nftables").inputs["stdin"]


def test_no_firewall_when_turned_off(values: dict) -> None:
    values["firewall"] = {"enabled": False}
    run = run_program(values)
    assert not [r for r in run.resources if r.name.endswith("-nftables")]
    assert any("firewall.enabled: false" in warning for warning in run.warnings)


def test_client_keys_travel_as_digests_and_the_internal_key_as_a_secret(values: dict,
                                                                         run: Run) -> None:
    assert not [r for r in run.resources if r.name.endswith("-clients")]  # none as shipped
    alice = "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90"
    values["router"]["door"]["clientKeys"] = {"alice": alice}
    run = run_program(values)
    # One on each door node, before the configuration that reads its maps.
    for role in ("door", "door-174-1-60-7"):
        clients = run.named(f"{role}-clients")
        assert clients.raw_inputs["stdin"].get(SIG_KEY) == SECRET_SIG
        assert run.waits_for(run.named(f"{role}-config"), clients), role
        assert ROUTER_API_KEY not in json.dumps(
            {name: clients.inputs.get(name, "") for name in ("create", "update", "delete")})
        assert "map_str(/opt/kimipd/router-31000/door/clients.map)" in run.named(
            f"{role}-config").inputs["stdin"]


ADMIN_KEY = "test-admin-key-not-real"


def test_the_admin_key_reaches_the_servers_key_files_only(values: dict) -> None:
    run = run_program(values, extra_secrets={"kimipd:adminApiKey": ADMIN_KEY})
    key_files = [r for r in run.resources if r.name.endswith("-sglang-api-key")]
    assert len(key_files) == 8
    for key_file in key_files:
        assert key_file.raw_inputs["stdin"].get(SIG_KEY) == SECRET_SIG
        assert f'admin-api-key: "{ADMIN_KEY}"' in key_file.inputs["stdin"]["value"]
    for resource in run.resources:
        for name in ("create", "update", "delete", "command", "envs", "labels"):
            assert ADMIN_KEY not in json.dumps(resource.inputs.get(name, "")), resource.name
    assert ADMIN_KEY not in json.dumps(run.stack_outputs)


def test_an_admin_key_without_keyed_servers_is_refused(values: dict) -> None:
    values["router"] = {"node": values["router"]["node"], "kind": "mini-lb"}
    with pytest.raises(Exception, match="adminApiKey: set, but with router.kind 'mini-lb'"):
        run_program(values, router_api_key=None,
                    extra_secrets={"kimipd:adminApiKey": ADMIN_KEY})
