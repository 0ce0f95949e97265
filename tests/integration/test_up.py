"""`pulumi up` for real: the engine and its providers against the simulated cluster.

Needs the command 1.2.1 and docker 5.2.0 resource plugins. scripts/install-pulumi installs them
from the official installer or from its drop-in directory; the Go module proxy reachable here
serves neither provider's module, so on a machine without either source this module is skipped,
saying so. The stacks are small (engine.small_values: a prefill and a decode group of two nodes,
on nodes 9-12), so the module runs beside the 8-node ones; the shipped shapes' first `up`s are
test_xpyd's, test_rollout's and test_readme_commands'. Two failing `up`s of stacks of their own
come first, on nodes with nothing on them; then one MiniLB stack, whose router starts last and
goes first. Tests run in file order, each building on the state the previous one left.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import pytest
from pulumi import automation as auto

from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    SMALL_ROUTER, Events, container_ids, env, new_stack, project, small_sim, small_values,
    with_minilb)
from tests.integration.sim import SMALL_NODES, SimCluster

pytestmark = pytest.mark.timeout(1800)
STACK = "up"
PREFILL_NODES, DECODE_NODES = SMALL_NODES[:2], SMALL_NODES[2:]
# decode's rank containers' resource names (by node and mode), as engine.DECODE_RANKS
DECODE_RANKS = [f"node-{node.replace('.', '-')}-decode" for node in DECODE_NODES]
ROUTER_NODE = DECODE_NODES[0]


def node_number(address: str) -> int:
    return int(address.rsplit(".", 1)[1])


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    """The MiniLB stack the tests from test_up_converges_and_the_router_answers on build on."""
    stack = new_stack(project, sim, STACK, with_minilb(small_values(sim)))
    stack.up()
    yield stack
    stack.destroy()


def test_preflight_failure_stops_before_any_container(project: Project, sim: SimCluster) -> None:
    stack = new_stack(project, sim, "preflight", small_values(sim))
    failing = PREFILL_NODES[1]
    sim.stop_dockerd(node_number(failing))
    try:
        with pytest.raises(auto.CommandError) as error:
            stack.up()
        message = str(error.value)
        assert (f"preflight failed on node {failing}: docker: docker engine does not answer"
                in message)
    finally:
        sim.start_node(node_number(failing))
    assert container_ids(sim) == {}, f"a container was started although {failing} failed preflight"
    stack.destroy()


def test_prefill_rank_exiting_while_loading_fails_the_gate(project: Project,
                                                           sim: SimCluster) -> None:
    values = with_minilb(small_values(sim))  # its router would wait for both groups
    values["groups"]["prefill"]["env"] = {"SGLANG_STANDIN_EXIT_WHILE_LOADING": "0"}
    values["gates"] = {"timeoutSeconds": 120, "intervalSeconds": 1}
    stack = new_stack(project, sim, "prefill-fault", values)
    with pytest.raises(auto.CommandError) as error:
        stack.up()
    message = str(error.value)
    assert f"kimipd-prefill-r0 on {PREFILL_NODES[0]}: not running: exited (exit code 1)" in message
    assert "CUDA out of memory" in message
    names = container_ids(sim)
    assert "kimipd-prefill-r0" in names
    assert not [n for n in names if "decode" in n or "router" in n], names
    stack.destroy()
    assert container_ids(sim) == {}


def test_up_converges_and_the_router_answers(stack: auto.Stack, sim: SimCluster) -> None:
    # The module's stack fixture ran the first `up`: what it converged. The runbook's order
    # (router last up, first down) is MiniLB's (engine.with_minilb).
    outputs = {key: value.value for key, value in stack.outputs().items()}
    assert outputs["routerUrl"] == SMALL_ROUTER
    assert outputs["generateUrl"] == SMALL_ROUTER + "/generate"
    assert outputs["smokeTest"].strip(), "the router returned no text"
    assert outputs["groups"]["decode"]["nodes"] == DECODE_NODES
    assert outputs["mooncakeMaster"] == f"{PREFILL_NODES[0]}:50051"
    assert outputs["containers"]["decode-r1"] == {
        "node": DECODE_NODES[1], "container": "kimipd-decode-r1",
        "healthUrl": f"http://{DECODE_NODES[1]}:30000/health"}
    for node in SMALL_NODES:
        assert outputs["nodes"][node]["imageDigest"].startswith("10.231.60.254:5000/kimipd/sim-node@sha256:")
    config = small_values(sim)
    assert outputs["nodeFiles"] == {f["destination"]: f["sha256"] for f in config["nodeFiles"]}
    running = container_ids(sim)
    # 4 ranks, the Mooncake master and MiniLB
    assert len(running) == 6 and all(v.endswith("running") for v in running.values()), running

def test_the_ssh_key_is_stored_encrypted(project: Project) -> None:
    # The state file itself: `export_stack()` would show secrets decrypted.
    (state,) = project.state.glob(f".pulumi/stacks/kimipd/{STACK}.json")
    text = state.read_text()
    assert "PRIVATE KEY" not in text, "the SSH key is in the state in plain text"
    assert '"ciphertext"' in text


def test_second_up_changes_nothing(stack: auto.Stack) -> None:
    events = Events()
    result = stack.up(on_event=events)
    assert set(result.summary.resource_changes) == {"same"}, result.summary.resource_changes
    assert events.changed() == set(), f"a no-op up ran: {events.changed()}"


def test_decode_only_change_replaces_only_decode(stack: auto.Stack, project: Project,
                                                 sim: SimCluster) -> None:
    before = container_ids(sim)
    groups = copy.deepcopy(small_values(sim)["groups"])
    groups["decode"]["extraArgs"] = ["--mem-fraction-static", "0.80", "--max-running-requests", "32"]
    project.update_stack(STACK, {"groups": groups})
    preview = Events()
    stack.preview(on_event=preview)
    assert preview.changed() == set(DECODE_RANKS) | {
        f"decode-r{r}-health" for r in range(2)} | {"smoke-test-generate"}, preview.changed()
    stack.up()
    after = container_ids(sim)
    for name in before:
        if "decode" in name:
            assert after[name] != before[name], f"{name} was not replaced"
        else:
            assert after[name] == before[name], f"{name} changed on a decode-only edit"


def wait_until_exited(sim: SimCluster, name: str, seconds: int = 90) -> None:
    for _ in range(seconds):
        if container_ids(sim).get(name, "").endswith("exited"):
            return
        time.sleep(1)
    raise AssertionError(f"{name} still running after {seconds}s: {container_ids(sim)}")


def test_drift_a_removed_rank_brings_its_whole_group_back(stack: auto.Stack, sim: SimCluster) -> None:
    before = container_ids(sim)
    sim.docker(DECODE_NODES[1], "rm", "-f", "kimipd-decode-r1")
    # The group dies with it: rank 0's watchdog, then the other ranks (as with NCCL).
    wait_until_exited(sim, "kimipd-decode-r0")
    refresh = stack.refresh()
    changes = refresh.summary.resource_changes
    assert changes.get("delete", 0) + changes.get("update", 0) >= 1, changes
    events = Events()
    result = stack.up(on_event=events)
    assert result.outputs["smokeTest"].value.strip()
    after = container_ids(sim)
    assert all(v.endswith("running") for v in after.values()), after
    for name in before:
        if "decode" in name:
            assert after[name] != before[name], f"{name} was not restarted with its group"
        else:
            assert after[name] == before[name], f"{name} changed although its group is healthy"
    assert {f"decode-r{r}-health" for r in range(2)} | {"smoke-test-generate"} <= events.changed()
    health = sim.ssh(DECODE_NODES[0], "curl -s -o /dev/null -w '%{http_code}' "
                                      f"http://{DECODE_NODES[0]}:30000/health")
    assert health.stdout == "200"


def test_a_stopped_container_is_replaced_and_gated_not_restarted_in_place(
        stack: auto.Stack, sim: SimCluster) -> None:
    """`docker stop` (not rm): refresh records `mustRun` drift; up must replace it (a new id), run
    its gate and the smoke test again, not start the old container and call that converged."""
    before = container_ids(sim)
    sim.docker(ROUTER_NODE, "stop", "kimipd-router")
    refresh = stack.refresh()
    assert refresh.summary.resource_changes.get("update", 0) >= 1, refresh.summary.resource_changes
    events = Events()
    result = stack.up(on_event=events)
    after = container_ids(sim)
    assert after["kimipd-router"] != before["kimipd-router"] and after["kimipd-router"].endswith("running")
    assert {name: v for name, v in after.items() if name != "kimipd-router"} == {
        name: v for name, v in before.items() if name != "kimipd-router"}
    assert {"router", "router-health", "smoke-test-generate"} <= events.changed(), events.changed()
    assert result.outputs["smokeTest"].value.strip()


def test_serving_false_removes_containers_and_true_restores_them(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    project.update_stack(STACK, {"serving": False})
    result = stack.up()
    assert "smokeTest" not in result.outputs
    assert container_ids(sim) == {}
    for node in SMALL_NODES:
        assert sim.docker(node, "image", "inspect", sim.image).returncode == 0, node
        assert sim.ssh(node, "test -f /opt/kimipd/launch.sh").returncode == 0, node
    project.update_stack(STACK, {"serving": True})
    result = stack.up()
    assert result.outputs["smokeTest"].value.strip()
    assert len(container_ids(sim)) == 6
