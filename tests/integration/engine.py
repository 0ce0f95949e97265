"""What the engine tests share: the engine, the sim, a project with its stacks, and readers of
the engine's events and of the nodes' containers."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pulumi import automation as auto

from bench.load import Load
from sim.automation import REQUIRED_PLUGINS, Project, engine_env, installed_plugins
from tests.conftest import REPO, stack_values
from tests.integration.sim import SHIPPED_NODES, SMALL_NODES, SimCluster, start_sim, stop_sim

NODES = SHIPPED_NODES
# Rank containers' resource names (by node and mode) in stack `sim`: P on .1-.4, D on .5-.8.
PREFILL_RANKS = [f"node-10-231-60-{i}-prefill" for i in range(1, 5)]
DECODE_RANKS = [f"node-10-231-60-{i}-decode" for i in range(5, 9)]
CONTAINER = "docker:index/container:Container"


def _engine_env() -> dict[str, str]:
    env = engine_env()
    missing = REQUIRED_PLUGINS - installed_plugins(env)
    if missing:
        pytest.skip("resource plugins not installed: " + ", ".join(f"{n} {v}" for n, v in sorted(missing))
                    + " (the Go module proxy serves neither provider; see scripts/install-pulumi)")
    return env


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return _engine_env()


@pytest.fixture(scope="module")
def sim(env) -> Iterator[SimCluster]:
    cluster = start_sim()
    cluster.remove_kimipd_containers(NODES)
    yield cluster
    cluster.remove_kimipd_containers(NODES)
    stop_sim(cluster)


@pytest.fixture(scope="module", name="sim")
def small_sim(env) -> Iterator[SimCluster]:
    """The sim for a module of small stacks (`small_values`): only nodes 9-12 are its, so it
    runs beside the modules of the 8-node stacks (scripts/test's second engine session)."""
    cluster = start_sim(SMALL_NODES)
    cluster.remove_kimipd_containers(SMALL_NODES)
    yield cluster
    cluster.remove_kimipd_containers(SMALL_NODES)
    stop_sim(cluster)


@pytest.fixture(scope="module")
def project(env, sim: SimCluster, tmp_path_factory) -> Project:
    return Project(tmp_path_factory.mktemp("kimipd-up"), env)


# The rust router's API key in the test stacks (a secret, as routerApiKey must be).
ROUTER_API_KEY = "kimipd-test-router-key"
AUTHORIZED = {"Authorization": f"Bearer {ROUTER_API_KEY}"}


def sim_values(sim: SimCluster, stack: str = "sim", door: bool = False, **changes) -> dict:
    """STACK's values on this sim, its images pinned to this sim's builds: the node image, the
    door's, where the stack has a door or DOOR adds one (test_door.py), and keepalived's, where
    the door stands on two nodes (sim-2p2d)."""
    values = copy.deepcopy(stack_values(stack))
    values["image"] = sim.image
    if door or values["router"].get("door") is not None:
        values["router"]["door"] = (values["router"].get("door") or {}) | {
            "image": sim.door_image}
        if values["router"]["door"].get("virtualIp") is not None:
            values["router"]["door"]["virtualIp"] = values["router"]["door"]["virtualIp"] | {
                "image": sim.keepalived_image}
    values.update(changes)
    return values


# The small stacks' router: on decode's first node, as stack `sim`'s is.
SMALL_ROUTER = f"http://{SMALL_NODES[2]}:31000"


def small_layout(values: dict) -> dict:
    """VALUES (stack `sim`'s) moved to the four small nodes: a prefill and a decode group of two
    nodes each (TP16; every rank >= 1 a peer of rank 0, as on the big stacks), the Mooncake
    master on prefill's first node and the router (its door and slots) on decode's first, as in
    stack `sim`. For the tests of the program's behaviour that do not need eight nodes: they run
    beside those that do (scripts/test); the shipped shapes keep their own tests
    (docs/tests.md)."""
    values["nodes"] = [{"address": node, "gpus": 8} for node in SMALL_NODES]
    values["mooncakeMaster"] = values["mooncakeMaster"] | {"node": SMALL_NODES[0]}
    for group, nodes in (("prefill", SMALL_NODES[:2]), ("decode", SMALL_NODES[2:])):
        values["groups"][group] = values["groups"][group] | {
            "nodes": nodes, "tpSize": 16, "epSize": 16}
    values["router"] = values["router"] | {"node": SMALL_NODES[2]}
    # A gate whose group cannot come up (a rank's node unreachable, an `up` interrupted while
    # it waits) waits this long before the `up` fails or ends: the sim's loads take seconds
    # (test_start_order's longest, 26 s), and 300 s of waiting cost test_faults ten minutes.
    values["gates"] = values["gates"] | {"timeoutSeconds": 60}
    return values


def small_values(sim: SimCluster, **changes) -> dict:
    """Stack `sim` on this sim, its images pinned, on the small nodes (`small_layout`)."""
    values = small_layout(sim_values(sim))
    values.update(changes)
    return values


def small_2p2d_values(sim: SimCluster) -> dict:
    """Pulumi.sim-2p2d.yaml moved to the four small nodes: four groups of one node each (TP8),
    the Mooncake master on prefill-a's node, the router, its door and both slots on decode-a's
    node (the door on two nodes and its virtual IP are the shared 2P2D stack's: test_door.py).
    For the modules that regroup a small stack to xPyD (test_up.py, test_observability.py)."""
    values = sim_values(sim, "sim-2p2d")
    values["nodes"] = [{"address": node, "gpus": 8} for node in SMALL_NODES]
    values["mooncakeMaster"] = values["mooncakeMaster"] | {"node": SMALL_NODES[0]}
    for name, node in zip(("prefill-a", "prefill-b", "decode-a", "decode-b"), SMALL_NODES):
        values["groups"][name] = values["groups"][name] | {
            "nodes": [node], "tpSize": 8, "epSize": 8}
    door = {key: value for key, value in values["router"]["door"].items()
            if key not in ("nodes", "virtualIp")}
    values["router"] = values["router"] | {"node": SMALL_NODES[2], "door": door}
    values["gates"] = values["gates"] | {"timeoutSeconds": 60}
    return values


def with_minilb(values: dict) -> dict:
    """VALUES with the runbook's MiniLB (a fixed worker list, started once every group is ready,
    no key): for the tests of that start and stop order. The stack files run the keyed rust
    router, whose order test_rollout.py, test_heal.py and test_security.py cover."""
    values["router"] = {key: value for key, value in values["router"].items()
                        if key in ("node", "port")} | {"kind": "mini-lb"}
    return values


def new_stack(project: Project, sim: SimCluster, name: str, values: dict) -> auto.Stack:
    project.write_stack(name, values)
    stack = project.stack(name)
    key = Path(sim.env["KIMIPD_SIM_KEY"]).read_text()
    stack.set_config("kimipd:sshPrivateKey", auto.ConfigValue(value=key, secret=True))
    stack.set_config("kimipd:routerApiKey", auto.ConfigValue(value=ROUTER_API_KEY, secret=True))
    return stack


# The stacks that engine modules share, each brought up once and destroyed once in a run
# (tests/integration/conftest.py runs a stack's modules back to back, in this order): a fresh
# stack costs an `up` that prepares every node and a destroy (docs/tests.md). A module on a shared
# stack takes it as the previous module left it and says so.
SHARED_2P2D = "sim-2p2d"
SHARED_2P2D_MODULES = ("test_rollout.py", "test_heal.py", "test_door.py")


def shared_2p2d_values(sim: SimCluster) -> dict:
    """Pulumi.sim-2p2d.yaml on this sim, with a gate timeout that bounds a failed gate's wait
    (and a group's drain waits that long for a canary to come back: its delete command, hence
    the timeout, is the one its group was created with), and decode at 26 tokens/s: streams
    long enough to be in flight while a slot or a group drains."""
    values = sim_values(sim, "sim-2p2d")
    values["gates"] = values["gates"] | {"timeoutSeconds": 60}
    values["container"]["env"] = {**values["container"]["env"],
                                  "SGLANG_STANDIN_DECODE_TOKENS_PER_S": "26"}
    return values


@dataclass(frozen=True)
class SharedKind:
    fixture: str  # the fixture a module's tests (or its `stack` fixture) ask for
    stack: str
    modules: tuple[str, ...]
    values: Callable[[SimCluster], dict]


SHARED_KINDS = (
    SharedKind("shared_2p2d", SHARED_2P2D, SHARED_2P2D_MODULES, shared_2p2d_values),
)


@dataclass
class SharedStack:
    sim: SimCluster
    project: Project
    stack: auto.Stack


_shared: dict[str, SharedStack] = {}


def _shared_stack(kind: SharedKind, request: pytest.FixtureRequest,
                  tmp_path_factory) -> Iterator[SharedStack]:
    """KIND's stack: brought up by the first module that asks for it, kept as that module
    leaves it (converged, or with whatever a test left dead), destroyed after the last test of
    the run that asks for it. The nodes' containers are removed before and after, as the `sim`
    fixture does for a module of its own."""
    if kind.stack not in _shared:
        env = _engine_env()
        cluster = start_sim()
        cluster.remove_kimipd_containers(NODES)
        project = Project(tmp_path_factory.mktemp(f"kimipd-{kind.stack}"), env)
        stack = new_stack(project, cluster, kind.stack, kind.values(cluster))
        try:
            stack.up()
        except BaseException:
            cluster.remove_kimipd_containers(NODES)
            raise
        _shared[kind.stack] = SharedStack(cluster, project, stack)
    shared = _shared[kind.stack]
    yield shared
    items = request.session.items
    last_here = max(i for i, item in enumerate(items) if item.module is request.module)
    if not any(kind.fixture in item.fixturenames for item in items[last_here + 1:]):
        del _shared[kind.stack]
        try:
            shared.stack.destroy()
        finally:
            shared.sim.remove_kimipd_containers(NODES)


@pytest.fixture(scope="module")
def shared_2p2d(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[SharedStack]:
    yield from _shared_stack(SHARED_KINDS[0], request, tmp_path_factory)


# A module on the shared 2P2D stack imports these three: its tests then take `stack`, `project`
# and `sim` as a module of its own stack's would.
@pytest.fixture(scope="module", name="stack")
def shared_2p2d_stack(shared_2p2d: SharedStack) -> auto.Stack:
    return shared_2p2d.stack


@pytest.fixture(scope="module", name="project")
def shared_2p2d_project(shared_2p2d: SharedStack) -> Project:
    return shared_2p2d.project


@pytest.fixture(scope="module", name="sim")
def shared_2p2d_sim(shared_2p2d: SharedStack) -> SimCluster:
    return shared_2p2d.sim


class Events:
    """The engine's step events, in the order it reported them."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str, str]] = []  # (phase, op, urn)

    def __call__(self, event: auto.EngineEvent) -> None:
        for phase, payload in (("pre", event.resource_pre_event),
                               ("done", event.res_outputs_event)):
            if payload is not None:
                self.steps.append((phase, auto.OpType(payload.metadata.op).value,
                                   payload.metadata.urn))

    def changed(self) -> set[str]:
        """Names of resources with any step other than `same`."""
        return {urn.rsplit("::", 1)[-1] for phase, op, urn in self.steps
                if phase == "pre" and op != "same" and "pulumi:pulumi:Stack" not in urn}

    def index(self, phase: str, op: str, name: str, type_: str = "") -> int:
        for i, (p, o, urn) in enumerate(self.steps):
            if p == phase and o == op and urn.endswith("::" + name) and type_ in urn:
                return i
        raise AssertionError(f"no {phase} {op} event for {name}: {self.steps}")


def kimipd(project: Project, stack_name: str, *args: str,
           timeout: float = 600) -> subprocess.CompletedProcess:
    """scripts/kimipd as the operator runs it; the backend from the environment, as pulumi's."""
    result = subprocess.run(
        [str(REPO / "scripts" / "kimipd"), "-s", stack_name, "--cwd", str(project.directory),
         *args], capture_output=True, text=True, timeout=timeout,
        env=os.environ | project.env | {"COLUMNS": "200"})
    # what the operator sees (docs/day-two.md shows these)
    print(f"\n$ scripts/kimipd -s {stack_name} {' '.join(args)}\n{result.stdout}{result.stderr}"
          f"[exit {result.returncode}]")
    return result


def status_problems(report: dict) -> dict:
    """What `status --json` found wrong, for an assertion's message: each container's, the
    door's and each slot's, the virtual IP's, and the notes."""
    door = report.get("door") or {}
    found = {row["container"] + "@" + row["node"]: row["problems"]
             for row in report.get("containers", []) if row.get("problems")}
    found |= {"door": door.get("problems"), "notes": report.get("notes"),
              "virtualIp": (report.get("virtualIp") or {}).get("problems")}
    found |= {f"slot {slot['slot']}": slot.get("problems")
              for slot in door.get("slots", [])}
    return {key: value for key, value in found.items() if value}


def settled_status(project: Project, stack_name: str,
                   within: float = 30) -> tuple[subprocess.CompletedProcess, dict]:
    """`status --json` until it says serving, for at most WITHIN seconds: right after an `up`,
    a router's health check (every 2 s on the sim) may not have seen a new worker yet. The last
    answer; any that was not serving is printed with its problems."""
    deadline = time.monotonic() + within
    while True:
        result = kimipd(project, stack_name, "status", "--json")
        report = json.loads(result.stdout)
        if report["verdict"] == "serving" or time.monotonic() >= deadline:
            return result, report
        print(f"status {report['verdict']}, again in 3 s: {status_problems(report)}")
        time.sleep(3)


def container_ids(sim: SimCluster) -> dict[str, str]:
    """container name -> "ID STATE" on every node of SIM's; a name on more than one node (the
    door and keepalived on two door nodes) is NAME on the first and NAME@NODE on the others."""
    ids = {}
    for node in sim.nodes:
        listing = sim.docker(node, "ps", "-a", "--filter", "label=kimipd.role",
                             "--format", "{{.Names}} {{.ID}} {{.State}}")
        for line in listing.stdout.split("\n"):
            if line.strip():
                name, cid, state = line.split()
                ids[name if name not in ids else f"{name}@{node}"] = f"{cid} {state}"
    return ids


def assert_replaced_only(before: dict[str, str], after: dict[str, str], prefix: str) -> None:
    """Every container named PREFIX... in BEFORE replaced and running in AFTER (container_ids),
    every other one as it was."""
    for name, state in before.items():
        if name.startswith(prefix):
            assert after[name] != state and after[name].endswith("running"), name
        else:
            assert after[name] == state, f"{name} changed when only {prefix}* was replaced"


ROUTER = "http://10.231.60.5:31000"


def generate_loop(stop: threading.Event, results: list[int], limit: int = 2000,
                  times: list[tuple[float, float]] | None = None, router: str = ROUTER) -> None:
    """One request at a time to ROUTER until STOP; RESULTS gets each HTTP status (0: no
    answer), TIMES (if given) when each was sent and answered (time.monotonic())."""
    body = json.dumps({"text": "load", "sampling_params": {"max_new_tokens": 4}}).encode()
    while not stop.is_set() and len(results) < limit:
        sent = time.monotonic()
        # The key is sent to MiniLB too, which ignores it.
        request = urllib.request.Request(router + "/generate", data=body,
                                         headers={"Content-Type": "application/json",
                                                  **AUTHORIZED})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                results.append(response.status)
        except urllib.error.HTTPError as failure:
            results.append(failure.code)
        except OSError:
            results.append(0)
        if times is not None:
            times.append((sent, time.monotonic()))
        time.sleep(0.05)


def up_under_load(stack: auto.Stack, what: str,
                  router: str = ROUTER) -> tuple[Events, list[int]]:
    """`up` while a client sends small /generate requests through ROUTER, one at a time;
    prints and returns what each got (HTTP status, 0: no answer)."""
    stop, results = threading.Event(), []
    loader = threading.Thread(target=generate_loop, args=(stop, results),
                              kwargs={"router": router}, daemon=True)
    loader.start()
    started = time.monotonic()
    events = Events()
    stack.up(on_event=events)
    stop.set()
    loader.join(30)
    failed = sum(1 for status in results if status != 200)
    print(f"{what}: {len(results)} requests in {time.monotonic() - started:.0f}s, "
          f"{failed} failed")
    return events, results


class StreamingLoad(Load):
    """bench/load.py's load through the door with the tests' key: RATE requests per second,
    every other one streamed, TOKENS tokens each; `results` are its Answers in the order sent
    (`failed(since)`: those without a whole answer, a stream cut under its 200 included)."""

    def __init__(self, rate: float = 10.0, url: str = ROUTER, tokens: int = 26) -> None:
        super().__init__(rate, url, ROUTER_API_KEY, tokens=tokens)
