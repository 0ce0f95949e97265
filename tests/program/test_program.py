"""The whole program under Pulumi's mocks: the resource graph, its edges, what each container gets."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.conftest import stack_values, without_the_door
from tests.program.harness import (
    MOCK_LOAD_SECONDS, PRIVATE_KEY, SECRET_SIG, SIG_KEY, Run, host_key_of, run_program, with_local_files)

pytestmark = pytest.mark.timeout(120)  # the SDK's threads can hang under mocks (pulumi#7663)

PREFILL = [f"174.1.60.{i}" for i in range(1, 5)]
DECODE = [f"174.1.60.{i}" for i in range(5, 9)]
CONTAINER = "docker:index/container:Container"


@pytest.fixture
def values(tmp_path: Path) -> dict:
    # pro6000's topology with the runbook's MiniLB, which starts once every group is ready;
    # the rust router pro6000 ships with is test_rust_router.py's and test_security.py's.
    # The single router (no door): the door's program tests are test_door.py's.
    values = without_the_door(stack_values("pro6000"))
    values["router"]["kind"] = "mini-lb"
    return with_local_files(values, tmp_path)


@pytest.fixture
def run(values: dict) -> Run:
    return run_program(values)


def node_rank(container) -> str:
    command = container.inputs["command"]
    return command[command.index("--node-rank") + 1]


def test_one_node_component_per_host(run: Run) -> None:
    nodes = run.of_type("kimipd:node:Node")
    assert sorted(n.name for n in nodes) == [f"node-174-1-60-{i}" for i in range(1, 9)]


def test_each_node_has_its_own_docker_provider_over_ssh(run: Run) -> None:
    providers = {p.name: p.inputs["host"] for p in run.of_type("pulumi:providers:docker")}
    assert providers == {f"node-174-1-60-{i}-docker": f"ssh://root@174.1.60.{i}:22"
                         for i in range(1, 9)}


def test_host_keys_are_pinned_for_both_providers(run: Run, values: dict) -> None:
    for provider in run.of_type("pulumi:providers:docker"):
        opts = json.loads(provider.inputs["sshOpts"])  # provider config arrives as JSON text
        assert opts[:4] == ["-o", f"UserKnownHostsFile={values['connection']['knownHostsFile']}",
                            "-o", "StrictHostKeyChecking=yes"], provider.name
    for command in run.of_type("command:remote:Command"):
        connection = command.inputs["connection"]["value"]  # the connection is a secret
        assert connection["hostKey"] == host_key_of(connection["host"]), command.name


def test_images_are_kept_on_destroy(run: Run) -> None:
    images = run.of_type("docker:index/remoteImage:RemoteImage")
    assert len(images) == 8
    assert all(i.inputs["keepLocally"] is True for i in images)
    assert {i.inputs["name"] for i in images} == {"lmsysorg/sglang:kimi-k3"}


@pytest.mark.parametrize("group, addresses", [("prefill", PREFILL), ("decode", DECODE)])
def test_each_rank_runs_on_its_node_with_its_rank(run: Run, group: str, addresses: list[str]) -> None:
    containers = run.containers()
    for rank, address in enumerate(addresses):
        container = containers[f"{group}-r{rank}"]
        provider_name = container.provider.split("::")[-1].split("::")[0]
        assert f"node-{address.replace('.', '-')}-docker" in provider_name, (
            f"{group} rank {rank} is not on {address}: provider {container.provider}")
        assert node_rank(container) == str(rank), f"{group} rank {rank} got --node-rank {node_rank(container)}"
        assert container.inputs["networkMode"] == "host" and container.inputs["ipcMode"] == "host"
        assert container.inputs["restart"] == "no"
        assert f"SGLANG_HOST_IP={address}" in container.inputs["envs"]


def test_mooncake_master_and_router_are_on_their_nodes(run: Run) -> None:
    containers = run.containers()
    assert "node-174-1-60-1-docker" in containers["mooncake-master"].provider
    assert "node-174-1-60-5-docker" in containers["router"].provider
    assert "gpus" not in containers["router"].inputs  # the router needs no GPU


def test_dependency_chain_follows_the_runbook(run: Run) -> None:
    containers = run.containers()
    gate = {name: run.named(f"{name}-ready") for name in
            ("mooncake-master", "prefill", "decode", "router")}
    smoke = run.named("smoke-test-generate")
    assert run.waits_for(gate["mooncake-master"], containers["mooncake-master"])
    for rank in range(4):
        assert run.waits_for(containers[f"prefill-r{rank}"], gate["mooncake-master"]), rank
        assert run.waits_for(gate["prefill"], containers[f"prefill-r{rank}"]), rank
        assert run.waits_for(containers[f"decode-r{rank}"], gate["prefill"]), rank
        assert run.waits_for(gate["decode"], containers[f"decode-r{rank}"]), rank
        assert not run.waits_for(containers[f"prefill-r{rank}"], gate["decode"])
    assert run.waits_for(containers["router"], gate["decode"])
    assert run.waits_for(gate["router"], containers["router"])
    assert run.waits_for(smoke, gate["router"])


def test_nothing_starts_before_every_node_is_prepared(run: Run) -> None:
    master = run.containers()["mooncake-master"]
    for i in range(1, 9):
        for part in ("image", "assets"):
            assert run.waits_for(master, run.named(f"node-174-1-60-{i}-{part}")), (i, part)


def test_gates_rerun_only_when_a_container_of_theirs_is_replaced(run: Run) -> None:
    check = run.named("decode-r0-health")
    assert check.inputs["triggers"] == [f"node-174-1-60-{5 + rank}-decode-id" for rank in range(4)]
    assert "/opt/kimipd/wait-healthy.sh" in check.inputs["create"]
    assert "http://174.1.60.5:30000/health" in check.inputs["create"]


def test_every_rank_is_gated_on_its_own_node(run: Run) -> None:
    """A dead rank >= 1 fails its own check, with its node, container and log tail."""
    for rank, node in enumerate(["174.1.60.5", "174.1.60.6", "174.1.60.7", "174.1.60.8"]):
        check = run.named(f"decode-r{rank}-health")
        assert check.inputs["connection"]["value"]["host"] == node, rank
        assert f"--url http://{node}:30000/health" in check.inputs["create"], rank
        assert f"--container kimipd-decode-r{rank} --node {node}" in check.inputs["create"], rank
        assert run.waits_for(run.containers()["router"], check), rank


def test_containers_wait_for_their_node_to_be_prepared(run: Run) -> None:
    container = run.containers()["decode-r2"]
    for name in ("node-174-1-60-7-image", "node-174-1-60-7-assets"):
        assert run.waits_for(container, run.named(name)), name
    assert run.waits_for(run.named("node-174-1-60-7-image"), run.named("node-174-1-60-7-preflight"))
    assert run.waits_for(run.named("node-174-1-60-7-dirs"), run.named("node-174-1-60-7-preflight"))


def test_smoke_test_answer_is_an_output(run: Run) -> None:
    assert run.stack_outputs["smokeTest"] == " from the decode server"
    assert run.stack_outputs["routerUrl"] == "http://174.1.60.5:31000"
    assert run.stack_outputs["generateUrl"] == "http://174.1.60.5:31000/generate"
    assert run.stack_outputs["groups"]["prefill"] == {
        "mode": "prefill", "endpoint": "http://174.1.60.1:30000", "bootstrapPort": 8998,
        "nodes": PREFILL, "healthSeconds": 21.0, "lastLoadSeconds": MOCK_LOAD_SECONDS,
        # twice the load its gate measured, within gates.timeoutSeconds (1800)
        "loadBoundSeconds": 2 * MOCK_LOAD_SECONDS}
    assert run.stack_outputs["nodes"]["174.1.60.5"]["roles"] == ["decode-r0", "router"]
    assert run.stack_outputs["nodes"]["174.1.60.5"]["imageDigest"].startswith(
        "lmsysorg/sglang:kimi-k3@sha256:")
    assert len(run.stack_outputs["nodeFiles"]) == 4  # the patch, flash_kda, Mooncake and smg


def test_the_verification_baseline_is_an_output_for_the_observability_project(run: Run) -> None:
    """observability/ derives its time-to-first-token ceiling from it (serving.ttft_ceiling)."""
    verification = run.stack_outputs["verification"]
    assert [request["name"] for request in verification["baseline"]] == [
        "warmup", "medium", "long"]
    assert set(verification["baseline"][0]) == {
        "name", "inputTokens", "outputTokens", "maxE2eSeconds", "minPrefillTokensPerSecond",
        "minDecodeTokensPerSecond"}
    assert verification["tolerance"] == 0.1


def test_ssh_key_is_a_secret_and_never_an_output(run: Run) -> None:
    assert not run.stack_outputs_secret
    assert PRIVATE_KEY not in json.dumps(run.stack_outputs)
    commands = run.of_type("command:remote:Command") + run.of_type("command:remote:CopyToRemote")
    assert commands
    for resource in commands:
        connection = resource.raw_inputs["connection"]
        # The whole connection travels as a secret value, key included.
        assert connection.get(SIG_KEY) == SECRET_SIG, resource.name
        assert PRIVATE_KEY not in json.dumps(resource.inputs.get("create", ""))
    for resource in run.of_type(CONTAINER) + run.of_type("pulumi:providers:docker"):
        assert "PRIVATE KEY" not in json.dumps(resource.raw_inputs), resource.name


def test_serving_false_keeps_node_prep_and_removes_every_container(values: dict) -> None:
    run = run_program({**values, "serving": False})
    assert run.of_type(CONTAINER) == []
    assert run.of_type("kimipd:gates:HealthGate") == []
    assert len(run.of_type("docker:index/remoteImage:RemoteImage")) == 8
    assert len(run.of_type("kimipd:assets:NodeAssets")) == 8
    assert "smokeTest" not in run.stack_outputs and run.stack_outputs["serving"] is False


def test_restart_generation_changes_every_container(values: dict, run: Run) -> None:
    bumped = run_program({**values, "restartGeneration": 1}).containers()
    before = run.containers()
    assert bumped.keys() == before.keys() and len(before) == 10
    for name, container in before.items():
        assert container.inputs != bumped[name].inputs, f"{name} would not be replaced"
        assert container.inputs["labels"] != bumped[name].inputs["labels"]


def test_decode_only_change_leaves_every_prefill_input_alone(values: dict, run: Run) -> None:
    changed = copy.deepcopy(values)
    changed["groups"]["decode"]["extraArgs"] = ["--max-running-requests", "128"]
    changed["groups"]["decode"]["env"] = {"SGLANG_LOG_LEVEL": "debug"}
    after = run_program(changed)
    for resource in run.resources:
        if (resource.name.startswith(("prefill", "mooncake-master", "node-"))
                and not resource.name.endswith("-decode")):
            assert resource.raw_inputs == after.by_urn(resource.urn).raw_inputs, (
                f"{resource.name} changed on a decode-only edit")
    for rank in range(4):
        assert run.containers()[f"decode-r{rank}"].inputs != after.containers()[f"decode-r{rank}"].inputs


def test_bad_config_registers_nothing(values: dict) -> None:
    values["groups"]["decode"]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    with pytest.raises(Exception) as error:
        run_program(values)
    assert "groups.decode.env.PYTORCH_CUDA_ALLOC_CONF" in str(error.value)


def test_missing_node_file_registers_nothing(values: dict, tmp_path: Path) -> None:
    values["nodeFiles"][0]["source"] = str(tmp_path / "gone.py")
    with pytest.raises(Exception) as error:
        run_program(values)
    assert "nodeFiles[0].source" in str(error.value) and "does not exist" in str(error.value)


# -- start order: decode waits for prefill's health (sequential) or its bootstrap server --------


def test_sequential_start_has_no_bootstrap_gate(run: Run) -> None:
    assert run.of_type("kimipd:gates:BootstrapGate") == []
    assert not [r for r in run.resources if r.name.endswith("-bootstrap")]


@pytest.fixture
def overlapped(values: dict) -> Run:
    return run_program({**values, "startOrder": "overlapped"})


def test_overlapped_start_gates_decode_on_prefill_rank0_bootstrap(overlapped: Run) -> None:
    (gate,) = overlapped.of_type("kimipd:gates:BootstrapGate")
    assert gate.name == "prefill-bootstrap"
    assert gate.parent == overlapped.named("prefill").urn
    check = overlapped.named("prefill-r0-bootstrap")
    assert check.parent == gate.urn
    # Polled on rank 0's own node; any HTTP answer from the bootstrap port passes.
    assert check.inputs["connection"]["value"]["host"] == "174.1.60.1"
    assert "--url http://174.1.60.1:8998/health --any-status" in check.inputs["create"]
    assert "--container kimipd-prefill-r0 --node 174.1.60.1" in check.inputs["create"]
    assert check.inputs["triggers"] == [f"node-174-1-60-{1 + rank}-prefill-id" for rank in range(4)]


def test_overlapped_start_edges(overlapped: Run) -> None:
    containers = overlapped.containers()
    gate = {name: overlapped.named(f"{name}-ready") for name in
            ("mooncake-master", "prefill", "decode", "router")}
    bootstrap = overlapped.named("prefill-bootstrap")
    for rank in range(4):
        prefill, decode = containers[f"prefill-r{rank}"], containers[f"decode-r{rank}"]
        assert overlapped.waits_for(prefill, gate["mooncake-master"]), rank
        # Every prefill rank exists before decode starts (and is stopped after it on destroy).
        assert overlapped.waits_for(bootstrap, prefill), rank
        assert overlapped.waits_for(decode, bootstrap), rank
        assert not overlapped.waits_for(decode, gate["prefill"]), (
            f"decode rank {rank} still waits for prefill's health gate")
    # The router and the smoke test wait for every group to be healthy, as before.
    assert overlapped.waits_for(containers["router"], gate["prefill"])
    assert overlapped.waits_for(containers["router"], gate["decode"])
    assert overlapped.waits_for(overlapped.named("smoke-test-generate"), gate["router"])
    assert overlapped.waits_for(overlapped.named("smoke-test-generate"), gate["prefill"])


def test_router_waits_for_every_group_in_sequential_start_too(run: Run) -> None:
    router = run.containers()["router"]
    assert run.waits_for(router, run.named("prefill-ready"))
    assert run.waits_for(router, run.named("decode-ready"))


def test_switching_start_order_changes_no_container_or_health_check(run: Run,
                                                                     overlapped: Run) -> None:
    """Only edges differ: switching an existing stack replaces nothing and re-runs no gate."""
    kept = [r for r in run.resources if r.name != "prefill-bootstrap"]
    for resource in kept:
        assert resource.raw_inputs == overlapped.by_urn(resource.urn).raw_inputs, (
            f"{resource.name} would change when switching to overlapped")
    added = {r.name for r in overlapped.resources} - {r.name for r in run.resources}
    assert added == {"prefill-bootstrap", "prefill-r0-bootstrap"}


def test_a_stopped_container_is_replaced_and_a_group_restarts_whole(run: Run) -> None:
    """After `refresh` records a stopped container (`mustRun` drift), `up` replaces it (a new id
    re-runs the gates and the smoke test); ranks >= 1 go whenever rank 0 goes."""
    containers = run.containers()
    for role, container in containers.items():
        assert container.replace_on_changes == ["mustRun"], role
        assert container.delete_before_replace, role  # fixed names and ports
    for group in ("prefill", "decode"):
        rank0 = containers[f"{group}-r0"]
        assert "kimipd.rank0-container" not in labels_of(rank0)
        for rank in range(1, 4):
            rank_n = containers[f"{group}-r{rank}"]
            # rank 0's id (the mocks' "<name>-id"): a new rank 0 is a new label here.
            assert labels_of(rank_n)["kimipd.rank0-container"] == f"{rank0.name}-id", (group, rank)
            assert rank0.urn in rank_n.dependencies


def labels_of(container) -> dict[str, str]:
    return {label["label"]: label["value"] for label in container.inputs["labels"]}


def test_rank_containers_are_named_by_node_and_mode_with_their_role_as_alias(run: Run) -> None:
    """Regrouping nodes replaces each node's container in place (see ServingGroup)."""
    containers = run.containers()
    assert containers["decode-r2"].name == "node-174-1-60-7-decode"
    assert containers["prefill-r0"].name == "node-174-1-60-1-prefill"
    assert containers["router"].name == "router"
