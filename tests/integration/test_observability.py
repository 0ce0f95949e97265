"""The observability project through the real engine on the sim: its stack comes up after a
1P1D serving stack (metrics on), reads it through StackReference and scrapes every target; a
killed decode rank reaches a webhook receiver on the sim bridge as KimipdGroupRankDown; the
serving stack regrouped to 2P2D (Pulumi.sim-2p2d.yaml's groups, rust router) changes only the
targets file of the observability stack, and Prometheus scrapes the new targets without a
restart. Tests run in file order on one pair of stacks, on the small nodes (engine.small_values
and small_2p2d_values, nodes 9-12), beside the 8-node modules."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pulumi import automation as auto

from sim.automation import ObservabilityProject, Project
from tests.conftest import REPO, observability_stack_values
from tests.integration.engine import (  # noqa: F401 - fixtures
    Events, env, new_stack, project, small_2p2d_values, small_sim, small_values, with_minilb)
from tests.integration.sim import SMALL_NODES, SimCluster

pytestmark = pytest.mark.timeout(2400)

OBS_NODE = SMALL_NODES[1]  # prefill's second node
DECODE_PEER = SMALL_NODES[3]  # decode's rank 1
BRIDGE = "10.231.60.254"
SERVING = "obs-serving"
OBS_LABEL = "kimipd-observability.role"


class Receiver:
    """An Alertmanager webhook receiver on the sim bridge: records each POST with its time."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append((time.monotonic(), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((BRIDGE, 0), Handler)
        self.url = f"http://{BRIDGE}:{self.server.server_address[1]}/kimipd-alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def firing(self, alertname: str, since: float) -> list[tuple[float, dict]]:
        return [(at, alert) for at, payload in self.received if at >= since
                for alert in payload["alerts"]
                if alert["labels"].get("alertname") == alertname and alert["status"] == "firing"]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def observability_values(serving: str, image: str, receiver_url: str) -> dict:
    """observability/Pulumi.sim.yaml's values for this run: its known_hosts and key under the
    run's KIMIPD_CACHE, like the serving stacks' (stack_values)."""
    values = observability_stack_values("sim")
    values["node"] = values["node"] | {"address": OBS_NODE}
    values["servingStack"] = f"organization/kimipd/{serving}"
    values["prometheus"]["image"] = image
    values["alertmanager"]["image"] = image
    values["alertmanager"]["receiverUrl"] = receiver_url
    return values


def sim_observability_image() -> str:
    """The sim's Prometheus + Alertmanager image, built if its inputs changed, pinned by digest."""
    result = subprocess.run([str(REPO / "sim" / "sim"), "build-observability-image"],
                            capture_output=True, text=True, timeout=1800, check=False)
    assert result.returncode == 0, f"sim/sim build-observability-image:\n{result.stderr[-3000:]}"
    return result.stdout.strip().splitlines()[-1]


def rfc3339(text: str) -> float:
    """Alertmanager's times (nanoseconds, `Z`) as epoch seconds."""
    whole, _, rest = text.rstrip("Z").partition(".")
    fraction = float("0." + rest) if rest else 0.0
    return datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp() + fraction


def remove_observability(sim: SimCluster) -> None:
    sim.ssh(OBS_NODE, f"ids=$(docker ps -aq --filter label={OBS_LABEL}); "
                      '[ -z "$ids" ] || docker rm -f $ids >/dev/null; '
                      "rm -rf /var/lib/kimipd-sim/observability")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def serving(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    # MiniLB first (no router target), then 2P2D behind the rust router adds its target.
    stack = new_stack(project, sim, SERVING,
                      with_minilb(small_values(sim, metrics={"enabled": True})))
    started = time.monotonic()
    stack.up()
    print(f"\nserving stack {SERVING} (1P1D, MiniLB, metrics on) up in "
          f"{time.monotonic() - started:.0f}s")
    yield stack
    stack.destroy()


@pytest.fixture(scope="module")
def obs_project(project: Project, tmp_path_factory) -> ObservabilityProject:
    return ObservabilityProject(tmp_path_factory.mktemp("kimipd-observability"), project)


@pytest.fixture(scope="module")
def observability(obs_project: ObservabilityProject, serving: auto.Stack, sim: SimCluster,
                  receiver: Receiver) -> Iterator[auto.Stack]:
    remove_observability(sim)
    obs_project.write_stack("obs", observability_values(SERVING, sim_observability_image(),
                                                        receiver.url))
    stack = obs_project.stack("obs")
    key = Path(sim.env["KIMIPD_SIM_KEY"]).read_text()
    stack.set_config("kimipd-observability:sshPrivateKey", auto.ConfigValue(value=key, secret=True))
    try:
        yield stack
        stack.destroy()
    finally:
        remove_observability(sim)


def query(prometheus: str, expression: str) -> list[dict]:
    url = f"{prometheus}/api/v1/query?query={urllib.parse.quote(expression)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for(prometheus: str, expression: str, predicate, seconds: float = 120) -> list[dict]:
    deadline, result = time.monotonic() + seconds, []
    while time.monotonic() < deadline:
        try:
            result = query(prometheus, expression)
        except OSError:
            result = []
        if predicate(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{expression} after {seconds}s: {result}")


def changed(events: Events) -> set[str]:
    """Resources with a step other than `same`; the StackReference's `read` is no change."""
    return {name for name in events.changed()
            if not any(phase == "pre" and op == "read" and urn.endswith("::" + name)
                       for phase, op, urn in events.steps)}


def prometheus_container(sim: SimCluster) -> str:
    return sim.docker(OBS_NODE, "inspect", "--format", "{{.Id}} {{.State.StartedAt}}",
                      "kimipd-obs-prometheus").stdout.strip()


def test_observability_comes_up_after_the_serving_stack_and_scrapes_every_target(
        observability: auto.Stack) -> None:
    started = time.monotonic()
    result = observability.up()
    print(f"\nobservability up: {time.monotonic() - started:.1f}s, "
          f"{result.summary.resource_changes}")
    outputs = {key: value.value for key, value in result.outputs.items()}
    assert outputs["prometheusUrl"] == f"http://{OBS_NODE}:9090"
    assert outputs["alertmanagerUrl"] == f"http://{OBS_NODE}:9093"
    assert outputs["targets"] == 5  # the Mooncake master and 4 ranks (MiniLB has no metrics)
    up = wait_for(outputs["prometheusUrl"], 'up{job="kimipd"}', lambda r: len(r) == 5 and all(
        sample["value"][1] == "1" for sample in r))
    print(f"all 5 targets up == 1 {time.monotonic() - started:.1f}s after `up` started")
    roles = sorted(sample["metric"]["role"] for sample in up)
    assert roles == sorted(["mooncake-master", *(f"prefill-r{i}" for i in range(2)),
                            *(f"decode-r{i}" for i in range(2))])
    again = Events()
    observability.preview(on_event=again)
    assert changed(again) == set(), f"a second preview would change {changed(again)}"


def test_a_killed_decode_rank_reaches_the_receiver_as_rank_down(
        observability: auto.Stack, sim: SimCluster, receiver: Receiver) -> None:
    outputs = {key: value.value for key, value in observability.outputs().items()}
    values = observability_values(SERVING, "x@sha256:" + "0" * 64, receiver.url)
    for_seconds = values["alerts"]["rankDownForSeconds"]
    scrape = values["prometheus"]["scrapeIntervalSeconds"]
    evaluation = values["prometheus"]["evaluationIntervalSeconds"]
    group_wait = values["alertmanager"]["groupWaitSeconds"]
    assert not receiver.firing("KimipdGroupRankDown", 0), receiver.received
    killed, killed_wall = time.monotonic(), time.time()
    assert sim.docker(DECODE_PEER, "kill", "kimipd-decode-r1").returncode == 0
    deadline = killed + 120
    while time.monotonic() < deadline and not receiver.firing("KimipdGroupRankDown", killed):
        time.sleep(0.1)
    fired = receiver.firing("KimipdGroupRankDown", killed)
    assert fired, f"no KimipdGroupRankDown at the receiver in 120s: {receiver.received}"
    at, alert = fired[0]
    elapsed = at - killed
    # startsAt: when the alert fired (Prometheus sends its FiredAt), `for` after it turned
    # pending at the first evaluation that saw a failed scrape.
    fired_after = rfc3339(alert["startsAt"]) - killed_wall
    print(f"\nKimipdGroupRankDown at the receiver {elapsed:.1f}s after `docker kill` of "
          f"kimipd-decode-r1: fired after {fired_after:.1f}s (for {for_seconds}s + "
          f"{fired_after - for_seconds:.1f}s to see it: scrape {scrape}s, evaluation "
          f"{evaluation}s), at the receiver {elapsed - fired_after:.1f}s later (group_wait "
          f"{group_wait}s): {alert['labels']} {alert['annotations']['summary']!r}")
    assert alert["labels"]["group"] == "decode" and alert["labels"]["mode"] == "decode"
    assert alert["labels"]["stack"] == SERVING
    # `for` from the first evaluation that sees the failed scrape: a scrape and an evaluation
    # interval to notice, one evaluation to fire after `for`, then Alertmanager's group_wait
    # (6-8 s on the sim). Three times that and 5 s is room for a busy machine, and still tells
    # a `for` or an interval read as minutes, or Alertmanager's 5-minute group_interval.
    bound = 3 * (for_seconds + scrape + 2 * evaluation + group_wait) + 5
    assert elapsed <= bound, f"{elapsed:.1f}s > {bound}s"
    down = query(outputs["prometheusUrl"], 'up{job="kimipd", role="decode-r1"}')
    assert down and down[0]["value"][1] == "0"


def test_2p2d_changes_only_the_targets_file_and_prometheus_scrapes_the_new_targets(
        observability: auto.Stack, serving: auto.Stack, project: Project,
        sim: SimCluster) -> None:
    before = prometheus_container(sim)
    project.write_stack(SERVING, small_2p2d_values(sim))
    started = time.monotonic()
    # refresh: the decode rank the previous test killed is recorded, then replaced with the rest.
    serving.up(refresh=True)
    print(f"\nserving stack 1P1D -> 2P2D (rust router): {time.monotonic() - started:.0f}s")

    preview = Events()
    summary = observability.preview(on_event=preview, diff=True)
    print(f"observability preview after the regroup: {summary.change_summary}; "
          f"changed: {sorted(changed(preview))}")
    assert changed(preview) == {"prometheus-targets"}, preview.steps
    events = Events()
    started = time.monotonic()
    result = observability.up(on_event=events)
    print(f"observability up after the regroup: {time.monotonic() - started:.1f}s, "
          f"{result.summary.resource_changes}")
    assert changed(events) == {"prometheus-targets"}, events.steps
    assert not {"create", "delete"} & set(result.summary.resource_changes), \
        result.summary.resource_changes
    assert result.summary.resource_changes.get("same", 0) >= 10

    prometheus = f"http://{OBS_NODE}:9090"
    started = time.monotonic()
    up = wait_for(prometheus, 'up{job="kimipd"} == 1', lambda r: len(r) == 8 and {
        s["metric"].get("group") for s in r} >= {"prefill-a", "prefill-b", "decode-a", "decode-b"})
    print(f"the 8 new targets (4 ranks, mc-master, the door and its two rust slots) "
          f"up == 1 {time.monotonic() - started:.1f}s after the file changed")
    assert {"door", "router"} <= {sample["metric"]["role"] for sample in up}
    assert {sample["metric"].get("slot") for sample in up if sample["metric"]["role"] == "router"} \
        == {"a", "b"}
    assert not query(prometheus, 'up{job="kimipd", group=~"prefill|decode"}'), \
        "the 1P1D groups are still targets"
    assert prometheus_container(sim) == before, "Prometheus was restarted"
    # Each slot router's own view: both groups of each mode healthy, matched to their groups.
    def by_slot_and_mode(samples: list[dict]) -> dict[tuple[str, str], str]:
        return {(s["metric"].get("slot", ""), s["metric"]["mode"]): s["value"][1]
                for s in samples}

    healthy = wait_for(prometheus, "kimipd:router_healthy_workers:sum",
                       lambda r: by_slot_and_mode(r) == {
                           (slot, mode): "2" for slot in "ab" for mode in ("prefill", "decode")},
                       seconds=60)
    print(f"the slot routers' healthy workers by mode: {by_slot_and_mode(healthy)}")
