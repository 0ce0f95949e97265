"""B6: what clients see behind the door (router.door, docs/door.md) while the cluster changes, the
rust router beside MiniLB.

For each router kind a 2P2D stack on the sim (Pulumi.sim-2p2d.yaml as shipped: a door and a router
slot on each of two nodes behind a virtual IP, decode at 26 tokens/s), and in it:
- the door's overhead: a small non-streamed /generate through the door against straight to slot
  a's own port, alternating, one request at a time, each sent in one segment (bench/load.py);
- four scenarios, each under a bounded open-loop load from this machine through the virtual
  IP (bench/load.py: RATE requests/s, every other one streamed), LEAD seconds of it before and
  after: (a) one router flag (the slots roll one at a time), (b) restartGeneration (every group
  and both slots replaced, the doors kept), (c) slot a's router SIGKILLed, then one `kimipd
  reconcile` pass (ops/reconcile.py, run in this process so that its engine events are seen)
  heals it, (d) router.node (a door, slot a, a decode rank) lost: its link on the sim bridge
  cut for LOST_SECONDS, then back, then one reconcile pass.
Per scenario: requests sent, failed by status or error, failed among those open at the kill,
p50/p99 latency of the whole answers, the up's (the heal's) wall time, and a timeline
(bench/timeline.py) of what a sampler thread recorded meanwhile: the door's slots UP (its
Prometheus exporter), each mode's healthy groups (rank 0 /health), and the engine's steps.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pulumi import automation as auto

from components.config import read_stack_file
from components.outputs import read_outputs
from ops.heal_policy import Limits
from ops.reconcile import Reconciler, Settings
from ops.remote import SshTransport
from ops.stack import load_stack
from ops.stack_engine import StackEngine
from sim.automation import REPO
from sim.cache import follow_cache

from .load import Answer, Load, generate, percentile
from .sim_bench import BENCH_ROUTER_KEY, SimBench, log
from .timeline import Timeline, draw

API_KEY = BENCH_ROUTER_KEY  # what SimBench.new_stack sets as routerApiKey
KINDS = ("rust", "mini-lb")
SCENARIOS = {
    "router-flag": "(a) one router flag",
    "every-container": "(b) restartGeneration: every group and both slots",
    "slot-killed": "(c) slot a SIGKILLed, one reconcile pass",
    "router-node-lost": "(d) router.node's link cut for 60 s, one reconcile pass",
}
LEAD_SECONDS = 2.0
# After the kill, before reconcile's pass: the door's checks mark the slot DOWN meanwhile.
KILLED_SECONDS = 5.0
# router.node's link down this long (as tests/integration/test_door.py), then up this long
# before reconcile's pass: keepalived there sees the holder's adverts and stays BACKUP.
LOST_SECONDS = 60.0
BACK_SECONDS = 5.0
SAMPLE_SECONDS = 0.5
OVERHEAD_PAIRS = 300
# Engine steps that change nothing (or only read).
QUIET_OPS = {"same", "read", "refresh"}


# -- what the stack's outputs say to probe ------------------------------------------------------

@dataclass(frozen=True)
class Probes:
    door_url: str
    door_node: str
    metrics_url: str  # the door's Prometheus exporter
    slots: dict[str, dict[str, Any]]  # the `door` output's: url, container, ...
    groups: dict[str, dict[str, Any]]  # the stack's `groups` output: mode, endpoint, nodes

    @classmethod
    def of(cls, outputs: Mapping[str, Any]) -> Probes:
        typed = read_outputs(dict(outputs))
        door = typed.door
        if door is None:
            raise SystemExit("the bench measures a stack with the door (router.door)")
        return cls(door.url, door.node, door.metrics_url,
                   {name: slot.model_dump(by_alias=True) for name, slot in door.slots.items()},
                   {name: group.model_dump(by_alias=True)
                    for name, group in typed.groups.items()})


def unit_of(name: str, type_: str, groups: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The unit a resource belongs to: a group (its rank containers, gates, drain and admission),
    router-a, router-b or the door; None for the rest (node preparation, the smoke test,
    components)."""
    if type_.startswith(("kimipd:", "pulumi:")):
        return None
    for unit in ("router-a", "router-b", "door", *groups):
        if name == unit or name.startswith(unit + "-"):
            return unit
    for group, spec in groups.items():
        # Rank containers are named by node and mode (node-10-231-60-5-decode).
        if name in {f"node-{node.replace('.', '-')}-{spec['mode']}" for node in spec["nodes"]}:
            return group
    return None


_SERVER_STATUS = re.compile(r"^haproxy_server_status\{([^}]*)\}\s+(\S+)", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def slot_states(metrics: str) -> dict[str, str]:
    """server -> its state at the door (UP, DOWN, DRAIN, MAINT, NOLB), from the exporter's
    `haproxy_server_status{proxy="slots", server=..., state=S} 1` (observability/rules.py)."""
    states = {}
    for labels, value in _SERVER_STATUS.findall(metrics):
        found = dict(_LABEL.findall(labels))
        if found.get("proxy") == "slots" and "server" in found and float(value) == 1:
            states[found["server"]] = found.get("state", "?")
    return states


def _get(url: str, timeout: float = 1.0) -> tuple[int, str]:
    """(status, body); (0, "") for no answer or an error status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return 0, ""


class Sampler:
    """Every SAMPLE_SECONDS until stopped: the slots UP at the door and each mode's groups whose
    rank 0 answers /health 200, on time.monotonic()."""

    def __init__(self, probes: Probes) -> None:
        self.probes = probes
        self.door: list[tuple[float, int | None]] = []
        self.groups: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1 + len(probes.groups))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _slots_up(self) -> int | None:
        status, text = _get(self.probes.metrics_url)
        if status != 200:
            return None
        return sum(1 for state in slot_states(text).values() if state == "UP")

    def _run(self) -> None:
        health = {name: (group["mode"], str(group["endpoint"]).rstrip("/") + "/health")
                  for name, group in self.probes.groups.items()}
        while not self._stop.is_set():
            at = time.monotonic()
            door = self._pool.submit(self._slots_up)
            answers = {name: self._pool.submit(_get, url) for name, (_, url) in health.items()}
            healthy = Counter(health[name][0] for name, answer in answers.items()
                              if answer.result()[0] == 200)
            self.door.append((at, door.result()))
            self.groups.append((at, healthy["prefill"], healthy["decode"]))
            self._stop.wait(max(0.0, at + SAMPLE_SECONDS - time.monotonic()))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)


class EngineSteps:
    """An on_event callback: (time.monotonic(), unit, resource) of each step of a unit's
    resources that changes something (its begin and its end)."""

    def __init__(self, groups: Mapping[str, Mapping[str, Any]]) -> None:
        self.groups = groups
        self.steps: list[tuple[float, str, str]] = []

    def __call__(self, event: auto.EngineEvent) -> None:
        at = time.monotonic()
        for payload in (event.resource_pre_event, event.res_outputs_event):
            if payload is None:
                continue
            meta = payload.metadata
            if auto.OpType(meta.op).value in QUIET_OPS:
                continue
            name = meta.urn.rsplit("::", 1)[-1]
            unit = unit_of(name, meta.type, self.groups)
            if unit is not None:
                self.steps.append((at, unit, name))


# -- one scenario -------------------------------------------------------------------------------

@dataclass
class Run:
    """What one scenario recorded (time.monotonic()) beyond the load and the sampler."""

    start: float
    engine: EngineSteps
    events: list[tuple[float, str]]
    wall: float = 0.0  # the up's or the heal's
    kill: tuple[float, float] | None = None  # the `docker kill` sent, returned
    decision: str | None = None  # reconcile's

    def mark(self, what: str) -> float:
        at = time.monotonic()
        self.events.append((at, what))
        return at


def summary(answers: list[Answer], kill: tuple[float, float] | None) -> dict[str, Any]:
    """Sent, failed by outcome, p50/p99 of the whole answers; with a kill, those open at it (sent
    before `docker kill` returned, answered after it was sent) and how many of them failed."""
    latencies = [answer.seconds for answer in answers if answer.ok]
    row: dict[str, Any] = {
        "sent": len(answers),
        "failed": dict(sorted(Counter(a.outcome for a in answers if not a.ok).items())),
        "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
    }
    if kill is not None:
        sent, returned = kill
        open_at_kill = [a for a in answers if a.sent < returned and a.done > sent]
        row["open_at_kill"] = len(open_at_kill)
        row["failed_open_at_kill"] = sum(1 for a in open_at_kill if not a.ok)
        row["failed_after_kill"] = sum(1 for a in answers if a.sent >= returned and not a.ok)
    return row


def fewest(sampler: Sampler) -> dict[str, int | None]:
    """The fewest slots UP at the door (of the samples its exporter answered) and healthy groups
    of each mode."""
    up = [count for _, count in sampler.door if count is not None]
    return {"slots_up": min(up, default=None),
            "prefill": min((sample[1] for sample in sampler.groups), default=None),
            "decode": min((sample[2] for sample in sampler.groups), default=None)}


def run_scenario(title: str, probes: Probes, rate: float,
                 act: Callable[[Run], None]) -> tuple[dict[str, Any], Timeline]:
    """ACT (an up, a kill and a heal) under the load and the sampler, LEAD_SECONDS of both
    before and after it."""
    run = Run(time.monotonic(), EngineSteps(probes.groups), [])
    with Sampler(probes) as sampler, Load(rate, probes.door_url, API_KEY) as load:
        time.sleep(LEAD_SECONDS)
        act(run)
        time.sleep(LEAD_SECONDS)
    answers = load.results
    end = time.monotonic()
    row = summary(answers, run.kill) | {"wall_seconds": run.wall, "fewest": fewest(sampler)}
    if run.decision is not None:
        row["decision"] = run.decision

    def since(at: float) -> float:
        return round(at - run.start, 3)

    timeline = Timeline(
        title, since(end),
        requests=[(since(a.sent), a.ok) for a in answers],
        door=[(since(at), up) for at, up in sampler.door],
        groups=[(since(at), prefill, decode) for at, prefill, decode in sampler.groups],
        steps=[(since(at), unit, name) for at, unit, name in run.engine.steps],
        events=[(since(at), what) for at, what in run.events])
    return row, timeline


def timed_up(stack: auto.Stack) -> Callable[[Run], None]:
    def act(run: Run) -> None:
        started = run.mark("up started")
        stack.up(on_event=run.engine)
        run.wall = run.mark("up done") - started
    return act


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """ENV in os.environ for the block: what `scripts/kimipd` is given (the CLI on PATH, the
    backend, the passphrase)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def reconcile_pass(bench: SimBench, name: str, work: Path, run: Run) -> None:
    """One `kimipd reconcile` pass (no grace, no hands-off window after our own ups), as the
    tests of the door run it; its wall time and decision into RUN."""
    directory = bench.project.directory
    limits = Limits(grace_seconds=0, human_window_seconds=0)
    with (work / f"reconcile-{name}.jsonl").open("a") as journal, \
            environment(bench.project.env):
        settings = Settings(stack=name, project_dir=directory, limits=limits, dry_run=False,
                            state_file=work / f"reconcile-{name}.json", log=journal)
        reconciler = Reconciler(
            settings, lambda: load_stack(name, directory),
            lambda access: SshTransport(access, connect_timeout=5.0),
            engine_factory=lambda: StackEngine(name, directory, on_event=run.engine))
        started = run.mark("reconcile pass")
        decision = reconciler.run_pass()
    run.wall = run.mark(f"reconcile: {decision.kind}") - started
    run.decision = f"{decision.kind}: {decision.message}"


def killed_and_healed(bench: SimBench, name: str, probes: Probes,
                      work: Path) -> Callable[[Run], None]:
    """SIGKILL of slot a's router container, then one reconcile pass."""
    container = probes.slots["a"]["container"]

    def act(run: Run) -> None:
        sent = run.mark("SIGKILL router-a")
        killed = bench.ssh(probes.door_node, f"docker kill --signal KILL {container}")
        run.kill = (sent, time.monotonic())
        assert killed.returncode == 0, killed.stderr
        time.sleep(KILLED_SECONDS)
        reconcile_pass(bench, name, work, run)
    return act


def sim_link(node: str, up: bool) -> None:
    """The host side of NODE's veth on the sim bridge (sim/sim: kpdvN for 10.231.60.N)."""
    link = "kpdv" + node.rsplit(".", 1)[-1]
    subprocess.run(["ip", "link", "set", link, "up" if up else "down"], check=True)


def node_lost_and_healed(bench: SimBench, name: str, probes: Probes,
                         work: Path) -> Callable[[Run], None]:
    """router.node's link cut for LOST_SECONDS (the other door node takes the virtual IP), put
    back, then one reconcile pass (what the cut left broken there). The cut counts as the kill:
    the requests open on the node at it are the ones it may fail."""
    node = probes.door_node

    def act(run: Run) -> None:
        sent = run.mark(f"link of {node} cut")
        try:
            sim_link(node, up=False)
            run.kill = (sent, time.monotonic())
            time.sleep(LOST_SECONDS)
        finally:
            sim_link(node, up=True)
        run.mark(f"link of {node} back")
        time.sleep(BACK_SECONDS)
        reconcile_pass(bench, name, work, run)
    return act


# -- the door's overhead ------------------------------------------------------------------------

def door_overhead(probes: Probes, pairs: int = OVERHEAD_PAIRS) -> dict[str, Any]:
    """p50/p99 (s) of a one-token, non-streamed /generate through the door and straight to slot
    a, PAIRS of each, alternating, one at a time."""
    paths = {"door": probes.door_url, "slot a": probes.slots["a"]["url"]}
    answers: dict[str, list[Answer]] = {path: [] for path in paths}
    for _ in range(pairs):
        for path, url in paths.items():
            answers[path].append(generate(url, API_KEY, tokens=1, streamed=False, timeout=10))
    result = {}
    for path, got in answers.items():
        latencies = [answer.seconds for answer in got if answer.ok]
        result[path] = {"sent": len(got), "failed": len(got) - len(latencies),
                        "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99)}
    return result


# -- the run --------------------------------------------------------------------------------------

def door_values(bench: SimBench, kind: str, door_image: str,
                keepalived_image: str) -> dict[str, Any]:
    """Pulumi.sim-2p2d.yaml (the door on two nodes) with router KIND and the sim's door and
    keepalived images; streams long enough to be open while a slot drains or dies (26 tokens
    at 26 tokens/s, as tests/integration/test_door.py)."""
    values = follow_cache(read_stack_file(REPO / "Pulumi.sim-2p2d.yaml"))
    values["image"] = bench.sim["KIMIPD_SIM_IMAGE"]
    values["container"]["env"] = {**values["container"]["env"],
                                  "SGLANG_STANDIN_DECODE_TOKENS_PER_S": "26"}
    door = values["router"]["door"] | {"image": door_image}
    if door.get("virtualIp") is not None:
        door["virtualIp"] = door["virtualIp"] | {"image": keepalived_image}
    router = values["router"] | {"kind": kind, "door": door}
    if kind == "mini-lb":
        # MiniLB refuses the rust router's settings (policy, health checks).
        router = {key: value for key, value in router.items()
                  if key in ("node", "kind", "port", "drainTimeoutSeconds", "door")}
    values["router"] = router
    return values


def measure(work: Path, rate: float, plots: Path | None = None) -> dict[str, Any]:
    """Every kind's overhead and scenarios; their timelines drawn into PLOTS as
    b6-KIND-SCENARIO.png (None: not drawn)."""
    bench = SimBench(work, load_seconds=3, parallel=None, gate_interval=None)
    door_image, keepalived_image = bench.door_image(), bench.keepalived_image()
    results: dict[str, Any] = {"rate": rate, "door_image": door_image,
                               "keepalived_image": keepalived_image, "kinds": {}}
    for kind in KINDS:
        name = f"b6-{kind}"
        values = door_values(bench, kind, door_image, keepalived_image)
        bench.remove_containers()
        stack = bench.new_stack(name, values)
        try:
            log(f"B6 {kind}: first up")
            stack.up()
            probes = Probes.of({key: output.value for key, output in stack.outputs().items()})
            kind_results: dict[str, Any] = {"overhead": door_overhead(probes), "scenarios": {}}
            log(f"B6 {kind}: door overhead {kind_results['overhead']}")
            for scenario in SCENARIOS:
                if scenario == "router-flag":
                    bench.project.update_stack(name, {"router": values["router"] | {
                        "extraArgs": ["--log-level", "warn"]}})
                elif scenario == "every-container":
                    bench.project.update_stack(name, {"restartGeneration": 1})
                acts = {"slot-killed": killed_and_healed, "router-node-lost": node_lost_and_healed}
                act = (acts[scenario](bench, name, probes, work) if scenario in acts
                       else timed_up(stack))
                row, timeline = run_scenario(f"{kind}: {SCENARIOS[scenario]}", probes, rate, act)
                log(f"B6 {kind} {scenario}: {row}")
                kind_results["scenarios"][scenario] = row | {"timeline": asdict(timeline)}
            results["kinds"][kind] = kind_results
        finally:
            bench.drop(stack)
    if plots is not None:
        draw_timelines(results, plots)
    return results


def draw_timelines(results: dict[str, Any], plots: Path) -> None:
    """Each scenario's recorded timeline as PLOTS/b6-KIND-SCENARIO.png (its row's `plot`)."""
    for kind, kind_results in results["kinds"].items():
        for scenario, row in kind_results["scenarios"].items():
            row["plot"] = str(plots / f"b6-{kind}-{scenario}.png")
            draw(Timeline(**row["timeline"]), Path(row["plot"]))


# -- the report -----------------------------------------------------------------------------------

def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _millis(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def cells(row: Mapping[str, Any]) -> dict[str, str]:
    """One scenario's figures as the table's cells."""
    failed = sum(row["failed"].values())
    by_outcome = ", ".join(f"{outcome}: {count}" for outcome, count in row["failed"].items())
    wall = f"{row['wall_seconds']:.0f}"
    if row.get("decision") and not str(row["decision"]).startswith("healed"):
        wall += f" ({str(row['decision']).split(':', 1)[0]})"
    least = row["fewest"]
    shown = {"sent": str(row["sent"]),
             "failed (by status / error)": f"{failed} ({by_outcome})" if failed else "0"}
    if "open_at_kill" in row:
        shown["failed of those open at the kill"] = (f"{row['failed_open_at_kill']} of "
                                                     f"{row['open_at_kill']}")
    return shown | {
        "p50 / p99 s": f"{_seconds(row['p50'])} / {_seconds(row['p99'])}",
        "up (heal) s": wall,
        "fewest slots UP / healthy P / D": " / ".join(
            "-" if least[key] is None else str(least[key])
            for key in ("slots_up", "prefill", "decode"))}


def render(results: Mapping[str, Any]) -> str:
    """The B6 table for docs/bench.md: each scenario's figures and the door's overhead, one
    column per router kind; then the timelines' images (paths relative to docs/)."""
    kinds = list(results["kinds"])
    lines = ["| scenario | measure | " + " | ".join(kinds) + " |",
             "| --- | --- |" + " --- |" * len(kinds)]
    for scenario, label in SCENARIOS.items():
        if not all(scenario in results["kinds"][kind]["scenarios"] for kind in kinds):
            continue  # a run from before the scenario was added
        per_kind = [cells(results["kinds"][kind]["scenarios"][scenario]) for kind in kinds]
        for index, measure_name in enumerate(per_kind[0]):
            lines.append(f"| {label if index == 0 else ''} | {measure_name} | "
                         + " | ".join(kind_cells[measure_name] for kind_cells in per_kind)
                         + " |")
    for path, measure_name in (("door", "through the door"), ("slot a", "straight to slot a")):
        figures = [results["kinds"][kind]["overhead"][path] for kind in kinds]
        label = "door overhead: one-token /generate, p50 / p99 ms" if path == "door" else ""
        lines.append(f"| {label} | {measure_name} ({figures[0]['sent']}, alternating) | "
                     + " | ".join(f"{_millis(f['p50'])} / {_millis(f['p99'])}"
                                  + (f" ({f['failed']} failed)" if f["failed"] else "")
                                  for f in figures) + " |")
    plots = [(kind, scenario, row["plot"]) for kind in kinds
             for scenario, row in results["kinds"][kind]["scenarios"].items() if "plot" in row]
    if plots:
        lines.append("")
        for kind, scenario, plot in plots:
            where = Path(plot)
            shown = (where.relative_to(REPO / "docs") if where.is_relative_to(REPO / "docs")
                     else where)
            lines.append(f"![{kind}, {SCENARIOS[scenario]}]({shown})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The table and the timelines again from a bench run's JSON (`scripts/bench --out`)."""
    parser = argparse.ArgumentParser(prog="python -m bench.availability",
                                     description=main.__doc__)
    parser.add_argument("run", type=Path, help="the bench's JSON with B6 in it")
    parser.add_argument("--plots", type=Path, default=REPO / "docs" / "bench",
                        help="where to draw the timelines (default docs/bench)")
    args = parser.parse_args(argv)
    results = json.loads(args.run.read_text())["results"]["B6"]
    draw_timelines(results, args.plots.resolve())
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
