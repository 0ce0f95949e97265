"""`pulumi up` for real: the engine and its providers against the simulated cluster, and past
1P1D on the same stack.

Needs the command 1.2.1 and docker 5.2.0 resource plugins. scripts/install-pulumi installs them
from the official installer or from its drop-in directory; the Go module proxy reachable here
serves neither provider's module, so on a machine without either source this module is skipped,
saying so. The stacks are small (engine.small_values: a prefill and a decode group of two nodes,
on nodes 9-12), so the module runs beside the 8-node ones; the shipped shapes' first `up`s are
test_rollout's and test_readme_commands'. Two failing `up`s of stacks of their own
come first, on nodes with nothing on them; then one MiniLB stack, whose router starts last and
goes first: converged, changed, drifted, taken out of service and back; then regrouped from
1P1D to 2P2D (four groups of one node, engine.small_2p2d_values) in one `up`, every group
serving through the real router, a real Prometheus scraping every target the stack lists, one
decode group restarted alone under load, and the 2P2D stack destroyed in the runbook's reverse
order. Tests run in file order, each building on the state the previous one left.
"""

from __future__ import annotations

import copy
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulumi import automation as auto

from components.outputs import read_outputs
from ops.cli import main as kimipd
from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    CONTAINER, SMALL_ROUTER, Events, assert_replaced_only, container_ids, env, new_stack, project, small_2p2d_values,
    small_sim, small_values, up_under_load, with_minilb)
from tests.integration.sim import SMALL_NODES, SimCluster

pytestmark = pytest.mark.timeout(1800)
STACK = "up"
PREFILL_NODES, DECODE_NODES = SMALL_NODES[:2], SMALL_NODES[2:]
# The rank containers' resource names (by node and mode), as engine.DECODE_RANKS: after the
# regroup to 2P2D, one group per node.
PREFILL_RANKS = [f"node-{node.replace('.', '-')}-prefill" for node in PREFILL_NODES]
DECODE_RANKS = [f"node-{node.replace('.', '-')}-decode" for node in DECODE_NODES]
ROUTER_NODE = DECODE_NODES[0]
ROUTER = SMALL_ROUTER
GROUPS_2P2D = ["prefill-a", "prefill-b", "decode-a", "decode-b"]


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
    # The outputs of a real `up` (the node-side values too) are what the model takes, as every
    # reader takes them (components/outputs.py).
    outputs = read_outputs({key: value.value for key, value in stack.outputs().items()})
    assert outputs.router_url == SMALL_ROUTER
    assert outputs.generate_url == SMALL_ROUTER + "/generate"
    assert outputs.smoke_test and outputs.smoke_test.strip(), "the router returned no text"
    assert outputs.groups["decode"].nodes == DECODE_NODES
    assert outputs.mooncake_master == f"{PREFILL_NODES[0]}:50051"
    assert outputs.containers is not None
    assert outputs.containers["decode-r1"].model_dump(by_alias=True) == {
        "node": DECODE_NODES[1], "container": "kimipd-decode-r1",
        "healthUrl": f"http://{DECODE_NODES[1]}:30000/health"}
    for node in SMALL_NODES:
        assert str(outputs.nodes[node].image_digest).startswith(
            "10.231.60.254:5000/kimipd/sim-node@sha256:")
    config = small_values(sim)
    assert outputs.node_files == {f["destination"]: f["sha256"] for f in config["nodeFiles"]}
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


# --- Past 1P1D: the same MiniLB stack regrouped to 2P2D ---------------------------------
# MiniLB's worker list is on its command line, so regrouping replaces it last (with the rust
# router the groups' memberships change instead: test_observability.py).

def two_by_two(sim: SimCluster) -> dict:
    """What the 2P2D layout changes from stack `sim`: the groups and metrics."""
    values = small_2p2d_values(sim)
    return {"groups": values["groups"], "metrics": values["metrics"]}


def outputs_of(stack: auto.Stack) -> dict:
    return {key: value.value for key, value in stack.outputs().items()}


def test_1p1d_becomes_2p2d_in_one_up(stack: auto.Stack, project: Project,
                                     sim: SimCluster) -> None:
    """Each node's rank container is replaced in place (named by node and mode), so no new
    group starts beside an old one's ports; each decode group after its half's prefill group,
    the router after every group."""
    project.update_stack(STACK, two_by_two(sim))
    preview = Events()
    stack.preview(on_event=preview)
    ops: dict[str, set[str]] = {}
    for phase, op, urn in preview.steps:
        if phase == "pre" and CONTAINER in urn and op != "same":
            ops.setdefault(urn.rsplit("::", 1)[-1], set()).add(op)
    assert set(ops) == {*PREFILL_RANKS, *DECODE_RANKS, "router"}, ops
    assert all("replace" in found and not {"create", "delete"} & found for found in ops.values())
    events = Events()
    result = stack.up(on_event=events)
    # Each decode group after its own half of the prefill groups (decode-a after prefill-a,
    # decode-b after prefill-b: components/cluster.paired_prefill).
    prefill_done = [events.index("done", "create-replacement", name, CONTAINER)
                    for name in PREFILL_RANKS]
    decode_created = [events.index("pre", "create-replacement", name, CONTAINER)
                      for name in DECODE_RANKS]
    for prefill, decode in zip(prefill_done, decode_created, strict=True):
        assert prefill < decode, "a decode group started before its prefill group's rank"
    assert max(decode_created) < events.index("pre", "create-replacement", "router", CONTAINER)
    outputs = {key: value.value for key, value in result.outputs.items()}
    assert sorted(outputs["groups"]) == sorted(GROUPS_2P2D)
    assert outputs["smokeTest"].strip()
    ids = container_ids(sim)
    assert sorted(ids) == sorted(["kimipd-mooncake-master", "kimipd-router", *(
        f"kimipd-{group}-r0" for group in GROUPS_2P2D)])
    assert all(state.endswith("running") for state in ids.values()), ids


def requests_by_group(outputs: dict) -> dict[str, float]:
    """What each group's rank 0 has served: SGLang's own counter, from its /metrics."""
    served = {}
    for name, group in outputs["groups"].items():
        with urllib.request.urlopen(group["endpoint"] + "/metrics", timeout=10) as response:
            text = response.read().decode()
        served[name] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith("sglang:num_requests_total{"))
    return served


def test_every_group_serves_through_the_router(stack: auto.Stack) -> None:
    outputs = outputs_of(stack)
    before = requests_by_group(outputs)
    body = json.dumps({"text": "which group", "sampling_params": {"max_new_tokens": 2}}).encode()
    for _ in range(40):
        request = urllib.request.Request(ROUTER + "/generate", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    after = requests_by_group(outputs)
    grew = {name: after[name] - before[name] for name in after}
    print(f"requests per group out of 40: {grew}")
    assert all(count > 0 for count in grew.values()), grew
    assert sum(grew[name] for name in ("decode-a", "decode-b")) == 40


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    """Debian's prometheus, on loopback, scraping the file_sd file `scripts/kimipd targets`
    writes, every second."""

    def __init__(self, targets: Path, work: Path) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: scripts/test installs Debian's package"
        config = work / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "kimipd", "scrape_timeout": "1s",
                                "file_sd_configs": [{"files": [str(targets)],
                                                     "refresh_interval": "1s"}]}],
        }))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (work / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expression: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?query={urllib.parse.quote(expression)}"
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait_for(self, expression: str, predicate, seconds: float = 90) -> list[dict]:
        deadline, result = time.monotonic() + seconds, []
        while time.monotonic() < deadline:
            try:
                result = self.query(expression)
            except OSError:
                result = []
            if predicate(result):
                return result
            time.sleep(1)
        raise AssertionError(f"{expression} after {seconds}s: {result}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def test_prometheus_scrapes_every_target_and_sees_tokens_grow(stack: auto.Stack) -> None:
    outputs = outputs_of(stack)
    work = Path(tempfile.mkdtemp(prefix="kimipd-prometheus-"))
    outputs_file = work / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    targets = work / "kimipd.json"
    assert kimipd(["targets", "--outputs-json", str(outputs_file), "--out", str(targets)]) == 0
    listed = {address for entry in json.loads(targets.read_text()) for address in entry["targets"]}
    assert len(listed) == 5  # the Mooncake master and 4 ranks
    prometheus = Prometheus(targets, work)
    try:
        up = prometheus.wait_for("up", lambda result: len(result) == 5 and all(
            sample["value"][1] == "1" for sample in result))
        labels = {sample["metric"]["instance"]: sample["metric"] for sample in up}
        assert set(labels) == listed
        decode_b = SMALL_NODES[3]
        decode_b0 = labels[f"{decode_b}:30000"]
        assert (decode_b0["group"], decode_b0["mode"], decode_b0["rank"], decode_b0["role"],
                decode_b0["node"], decode_b0["stack"]) == ("decode-b", "decode", "0",
                                                           "decode-b-r0", decode_b, STACK)
        total = "sum(sglang:generation_tokens_total)"
        before = prometheus.wait_for(total, lambda result: len(result) == 1)
        body = json.dumps({"text": "count me", "sampling_params": {"max_new_tokens": 8}}).encode()
        for _ in range(10):
            request = urllib.request.Request(ROUTER + "/generate", data=body,
                                             headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=30).close()
        grown = float(before[0]["value"][1]) + 80
        prometheus.wait_for(total, lambda result: result and float(result[0]["value"][1]) >= grown)
        assert prometheus.query("sum(sglang:time_to_first_token_seconds_count)")
    finally:
        prometheus.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_restarting_one_decode_group_leaves_every_other_container_alone(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    before = container_ids(sim)
    groups = two_by_two(sim)["groups"]
    groups["decode-b"]["restartGeneration"] = 1
    project.update_stack(STACK, {"groups": groups})
    events, results = up_under_load(stack, "decode-b restart through MiniLB", router=ROUTER)
    failed = sum(1 for status in results if status != 200)
    restarted = {DECODE_RANKS[1]}
    assert {name for name in events.changed() if name.startswith("node-")} == restarted
    assert events.changed() - restarted == {"decode-b-r0-health",
                                            "smoke-test-generate"}, events.changed()
    assert_replaced_only(before, container_ids(sim), "kimipd-decode-b-")
    assert results and results[-1] == 200, results[-10:]
    assert failed < len(results), "no request succeeded"


# The module's last test: its fixture then finds nothing left to destroy.
def test_destroy_runs_in_reverse_order_and_keeps_images(stack: auto.Stack, sim: SimCluster) -> None:
    events = Events()
    stack.destroy(on_event=events)
    router_gone = events.index("done", "delete", "router", CONTAINER)
    decode_starts = [events.index("pre", "delete", name, CONTAINER) for name in DECODE_RANKS]
    decode_gone = [events.index("done", "delete", name, CONTAINER) for name in DECODE_RANKS]
    prefill_starts = [events.index("pre", "delete", name, CONTAINER) for name in PREFILL_RANKS]
    prefill_gone = [events.index("done", "delete", name, CONTAINER) for name in PREFILL_RANKS]
    master_starts = events.index("pre", "delete", "mooncake-master", CONTAINER)
    assert router_gone < min(decode_starts), "decode stopped before the router"
    # The reverse of the start: each prefill group after the decode group of its half.
    for decode, prefill in zip(decode_gone, prefill_starts, strict=True):
        assert decode < prefill, "a prefill group stopped before its half's decode group"
    assert max(prefill_gone) < master_starts, "mc-master stopped before prefill"
    assert container_ids(sim) == {}
    for node in SMALL_NODES:
        assert sim.docker(node, "image", "inspect", sim.image).returncode == 0, f"image gone on {node}"
