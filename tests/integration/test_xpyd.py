"""Past 1P1D, through the real engine on the sim: a running 1P1D stack becomes 2P2D (stack file
Pulumi.sim-2p2d.yaml) in one `up`, every group serves through the real router, a real Prometheus
scrapes every target the stack lists, one decode group restarts alone under load, and the
2P2D stack is destroyed in the runbook's reverse order. Tests run in file order on one stack:
stack `sim` with MiniLB on the small nodes (engine.small_values, nodes 9-12), 1P1D, converged,
regrouped to four groups of one node (engine.small_2p2d_values), beside the 8-node modules."""

from __future__ import annotations

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

from ops.cli import main as kimipd
from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    CONTAINER, SMALL_ROUTER, Events, container_ids, env, new_stack, project, small_2p2d_values,
    small_sim, small_values, up_under_load, with_minilb)
from tests.integration.sim import SMALL_NODES, SimCluster

pytestmark = pytest.mark.timeout(1800)

GROUPS_2P2D = ["prefill-a", "prefill-b", "decode-a", "decode-b"]
# Rank containers' resource names (by node and mode): one group per node after the regroup.
PREFILL_RANKS = [f"node-{node.replace('.', '-')}-prefill" for node in SMALL_NODES[:2]]
DECODE_RANKS = [f"node-{node.replace('.', '-')}-decode" for node in SMALL_NODES[2:]]
ROUTER = SMALL_ROUTER
# MiniLB's worker list is on its command line, so regrouping replaces it last (with the rust
# router the groups' memberships change instead: test_observability.py).
STACK = "sim"


def two_by_two(sim: SimCluster) -> dict:
    """What the 2P2D layout changes from stack `sim`: the groups and metrics."""
    values = small_2p2d_values(sim)
    return {"groups": values["groups"], "metrics": values["metrics"]}


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    stack = new_stack(project, sim, STACK, with_minilb(small_values(sim)))
    stack.up()
    yield stack
    stack.destroy()  # nothing left when the destroy-order test ran


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
    after = container_ids(sim)
    for name, state in before.items():
        if name.startswith("kimipd-decode-b-"):
            assert after[name] != state and after[name].endswith("running"), name
        else:
            assert after[name] == state, f"{name} changed when only decode-b restarted"
    assert results and results[-1] == 200, results[-10:]
    assert failed < len(results), "no request succeeded"


# The shared stack's last test: its fixture then finds nothing left to destroy.
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
