"""The rust router under Pulumi's mocks (stack sim-2p2d): it starts with the nodes, each group is
admitted after its own gate and drained before its containers go, the API key stays a secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import stack_values, without_the_door
from tests.program.harness import (
    ROUTER_API_KEY, SECRET_SIG, SIG_KEY, Run, run_program, run_refused, with_local_files)

pytestmark = pytest.mark.timeout(120)  # the SDK's threads can hang under mocks (pulumi#7663)

GROUPS = ["prefill-a", "prefill-b", "decode-a", "decode-b"]


@pytest.fixture
def values(tmp_path: Path) -> dict:
    # The single rust router's order and key (the door's slots are test_door.py's).
    values = without_the_door(stack_values("sim-2p2d"))
    for node_file in values["nodeFiles"]:
        node_file.pop("sha256")  # with_local_files writes stand-in files
    return with_local_files(values, tmp_path)


@pytest.fixture
def run(values: dict) -> Run:
    return run_program(values)


def test_the_router_starts_with_the_nodes_not_after_the_groups(run: Run) -> None:
    router = run.containers()["router"]
    for group in GROUPS:
        assert not run.waits_for(router, run.named(f"{group}-ready")), group
    command = router.inputs["command"]
    assert "--prefill" not in command and "--decode" not in command
    launcher = next(i for i, word in enumerate(command) if word.endswith("/router-launch.py"))
    assert command[launcher - 1] == "python3" and command[launcher + 1] == "--api-key-file"


def test_each_group_is_admitted_after_its_gate_and_the_routers(run: Run) -> None:
    router_gate = run.named("router-ready")
    for group in GROUPS:
        admit = run.named(f"{group}-admit")
        assert run.waits_for(admit, run.named(f"{group}-ready")), group
        assert run.waits_for(admit, router_gate), group
        others = [g for g in GROUPS if g != group]
        assert not any(run.waits_for(admit, run.named(f"{g}-ready")) for g in others), group
        assert f"--group {group}" in admit.inputs["create"]
        # Re-admitted when the group's gate or the router is replaced.
        assert admit.inputs["triggers"] == ["router-id", f"{group}-r0-health-id",
                                            f"{group}-r1-health-id"], group
    readiness = run.named("router-every-group-healthy")
    smoke = run.named("smoke-test-generate")
    assert run.waits_for(smoke, readiness)
    assert all(run.waits_for(readiness, run.named(f"{g}-admit")) for g in GROUPS)


def test_a_groups_drain_goes_before_its_containers_and_follows_rank0(run: Run) -> None:
    containers = run.containers()
    for group in GROUPS:
        drain = run.named(f"{group}-drain")
        for rank in range(2):
            assert run.waits_for(drain, containers[f"{group}-r{rank}"]), (group, rank)
        # The rank 0 id: whatever replaces the group replaces its drain, whose delete drains.
        assert drain.inputs["triggers"] == [containers[f"{group}-r0"].name + "-id"], group
        assert "drain" in drain.inputs["delete"] and "--rollout one-group-at-a-time" in \
            drain.inputs["delete"]
        want = run.named(f"{group}-want")
        assert run.waits_for(want, drain), "want must be deleted before drain"
        assert "unwant" in want.inputs["delete"]


def test_a_new_router_gets_the_serving_groups_before_any_admission(run: Run) -> None:
    restore = run.named("router-restore")
    assert restore.inputs["triggers"] == ["router-id"]
    assert run.waits_for(restore, run.named("router-ready"))
    for group in GROUPS:
        assert not run.waits_for(restore, run.named(f"{group}-ready")), group
        assert run.waits_for(run.named(f"{group}-admit"), restore), group
        want = run.named(f"{group}-want").inputs["create"]
        assert ("--bootstrap-port 8998" in want) == group.startswith("prefill"), want


def test_the_api_key_is_a_secret_on_stdin_and_never_on_a_command_line(run: Run) -> None:
    key_file = run.named("router-api-key")
    assert key_file.raw_inputs["stdin"].get(SIG_KEY) == SECRET_SIG
    assert key_file.delete_before_replace
    for resource in run.resources:
        for name in ("create", "delete", "command", "envs", "labels"):
            assert ROUTER_API_KEY not in json.dumps(resource.inputs.get(name, "")), resource.name
    router = run.containers()["router"]
    assert run.waits_for(router, key_file)
    assert run.stack_outputs_secret or ROUTER_API_KEY not in json.dumps(run.stack_outputs)


def test_the_rust_router_is_a_prometheus_target(run: Run) -> None:
    targets = run.stack_outputs["prometheusTargets"]
    router = [t for t in targets if t["labels"]["role"] == "router"]
    assert router == [{"targets": ["10.231.60.5:29000"],
                       "labels": {"stack": "test", "role": "router", "node": "10.231.60.5"}}]


def test_the_rust_router_without_a_key_is_refused_before_any_resource(values: dict) -> None:
    message, run = run_refused(values, router_api_key=None)
    assert message.startswith("invalid kimipd secrets:\n  routerApiKey: not set")
    assert "pulumi config set --secret routerApiKey" in message
    assert run.resources == []


def test_one_group_of_a_mode_is_a_warning_naming_it(values: dict) -> None:
    values["groups"] = {name: group for name, group in values["groups"].items()
                        if name in ("prefill-a", "decode-a", "decode-b")}
    run = run_program(values)
    assert [w for w in run.warnings if "the only prefill group" in w] == [
        w for w in run.warnings if w.startswith("groups.prefill-a: the only prefill group")]
    assert len(run.warnings) == 1, run.warnings
