"""B1, B2, B3 and B5: the real engine and providers against the simulated cluster.

Every stack lives in a project directory of its own (sim/automation.py's Project: file backend,
inline program), is destroyed and removed when measured, and every kimipd container on the sim
nodes is removed before and after. The sim itself is never started or stopped here.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pulumi import automation as auto

from components.config import read_stack_file
from components.outputs import read_outputs
from sim.automation import (
    REPO,
    REQUIRED_PLUGINS,
    Project,
    engine_env,
    installed_plugins,
    sim_exports,
)
from sim.cache import follow_cache

from .phases import NODE_PREPARATION, Recorder, change_counts

SIM = REPO / "sim" / "sim"
NODES = [f"10.231.60.{i}" for i in range(1, 9)]
ORDERS = ("sequential", "overlapped")
# B3: a PD stack needs a node per group, so 2 is the smallest.
PREPARATION_SIZES = (2, 4, 8)
# What an SGLang rank's log says on its way to ready: (milestone, first line containing).
MILESTONES = (
    ("launch.sh done", "launch.sh: exec"),
    ("server up", "sglang stand-in"),
    ("group joined", "loading model"),
    ("loaded", "Load weight end"),
    ("ready", "The server is fired up and ready to roll!"),
)

# The bench stacks' routerApiKey (a secret, as the program requires with the rust router).
BENCH_ROUTER_KEY = "kimipd-bench-router-key"


class SimUnavailable(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"bench: {message}", flush=True)


class SimBench:
    def __init__(self, work: Path, *, load_seconds: float, parallel: int | None,
                 gate_interval: int | None) -> None:
        status = subprocess.run([str(SIM), "status"], capture_output=True, text=True, check=False)
        if status.returncode != 0:
            raise SimUnavailable("the sim is not up (`sim/sim status`); the bench never starts "
                                 f"it:\n{status.stdout}{status.stderr}")
        self.env = engine_env()
        missing = REQUIRED_PLUGINS - installed_plugins(self.env)
        if missing:
            raise SimUnavailable("resource plugins not installed: "
                                 + ", ".join(f"{n} {v}" for n, v in sorted(missing)))
        self.sim = sim_exports()
        self.project = Project(work, self.env)
        self.load_seconds = load_seconds
        self.parallel = parallel
        self.gate_interval = gate_interval

    # -- the sim's nodes ---------------------------------------------------------------------

    def ssh(self, node: str, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", self.sim["KIMIPD_SIM_SSH_CONFIG"], f"root@{node}",
                               command], capture_output=True, text=True, timeout=300, check=False)

    def timeline(self, node: str, container: str) -> dict[str, float]:
        """Unix times of a container's creation, start and log milestones (docker's clock)."""
        template = "'{{.Created}} {{.State.StartedAt}}'"
        inspect = self.ssh(node, f"docker inspect --format {template} {container}").stdout.split()
        times = {"created": docker_time(inspect[0]), "started": docker_time(inspect[1])}
        logs = self.ssh(node, f"docker logs --timestamps {container} 2>&1").stdout.splitlines()
        for milestone, text in MILESTONES:
            hit = next((line for line in logs if text in line), None)
            if hit is not None:
                times[milestone] = docker_time(hit.split(" ", 1)[0])
        return times

    def door_image(self) -> str:
        """The door's image (HAProxy from Debian's package), pinned: `sim/sim build-door-image`
        builds it once per its inputs and prints REPO@DIGEST."""
        return self._built_image("build-door-image")

    def keepalived_image(self) -> str:
        """The virtual IP's image (keepalived from Debian's package), pinned, as the door's."""
        return self._built_image("build-keepalived-image")

    @staticmethod
    def _built_image(command: str) -> str:
        result = subprocess.run([str(SIM), command], capture_output=True, text=True,
                                timeout=900, check=False)
        if result.returncode != 0 or not result.stdout.strip():
            raise SimUnavailable(f"sim/sim {command} failed:\n{result.stderr[-3000:]}")
        return result.stdout.strip().splitlines()[-1]

    def remove_containers(self) -> None:
        for node in NODES:
            self.ssh(node, "ids=$(docker ps -aq --filter label=kimipd.role); "
                           '[ -z "$ids" ] || docker rm -f $ids >/dev/null')

    # -- stacks ------------------------------------------------------------------------------

    def values(self, order: str = "sequential") -> dict[str, Any]:
        """Pulumi.sim.yaml with the sim's image, ORDER, and the load delays the bound uses; its
        key, known_hosts and node files under the sim's KIMIPD_CACHE."""
        values = follow_cache(read_stack_file(REPO / "Pulumi.sim.yaml"))
        values["image"] = self.sim["KIMIPD_SIM_IMAGE"]
        # MiniLB, as every earlier time-to-serve figure (docs/bench.md): its router starts once
        # decode is ready, which is what the critical-path bound models; stack `sim` itself now
        # runs the keyed rust router, which starts with the nodes.
        values["router"] = {key: value for key, value in values["router"].items()
                            if key in ("node", "port")} | {"kind": "mini-lb"}
        values["startOrder"] = order
        for group in values["groups"].values():
            group["env"] = {**group.get("env", {}),
                            "SGLANG_STANDIN_LOAD_SECONDS": f"{self.load_seconds:g}"}
        if self.gate_interval is not None:
            values["gates"] = {**values.get("gates", {}), "intervalSeconds": self.gate_interval}
        return values

    def new_stack(self, name: str, values: dict[str, Any]) -> auto.Stack:
        self.project.write_stack(name, values)
        stack = self.project.stack(name)
        key = Path(self.sim["KIMIPD_SIM_KEY"]).read_text()
        stack.set_config("kimipd:sshPrivateKey", auto.ConfigValue(value=key, secret=True))
        # The rust router's (and its servers') key; MiniLB stacks ignore it.
        stack.set_config("kimipd:routerApiKey",
                         auto.ConfigValue(value=BENCH_ROUTER_KEY, secret=True))
        return stack

    def up(self, stack: auto.Stack,
           on_event: Callable | None = None) -> tuple[float, auto.UpResult]:
        started = time.monotonic()
        result = stack.up(on_event=on_event, parallel=self.parallel)
        return time.monotonic() - started, result

    def drop(self, stack: auto.Stack) -> None:
        stack.destroy(parallel=self.parallel)
        stack.workspace.remove_stack(stack.name)
        self.remove_containers()

    # -- B1: time to serve from a fresh stack, by phase ------------------------------------------

    def time_to_serve(self, order: str, run: int) -> tuple[dict[str, Any], auto.Stack]:
        self.remove_containers()
        stack = self.new_stack(f"b1-{order}-{run}", self.values(order))
        recorder = Recorder()
        wall, result = self.up(stack, recorder)
        outputs = read_outputs({key: value.value for key, value in result.outputs.items()})
        assert (outputs.smoke_test or "").strip(), "the smoke test returned no text"
        spans = recorder.spans()
        decode_start = min(s.start for s in recorder.steps.values()
                           if s.name.endswith("-decode") and s.type.endswith("Container"))
        prefill_healthy = max(s.end or 0 for s in recorder.steps.values()
                              if s.name.startswith("prefill-r") and s.name.endswith("-health"))
        # Where a group's time goes, rank 0 (seconds after the container was created); the gate
        # as the engine saw it, on the recorder's clock.
        launch = {}
        for group, node in (("prefill", NODES[0]), ("decode", NODES[4])):
            times = self.timeline(node, f"kimipd-{group}-r0")
            gate_end = recorder.step(f"{group}-r0-health").end
            assert gate_end is not None, f"{group}-r0-health began but never finished"
            gate = recorder.wall0 + gate_end
            launch[group] = {k: v - times["created"] for k, v in times.items() if k != "created"}
            launch[group]["gate done"] = gate - times["created"]
        measured = {
            "order": order,
            "resources": len(recorder.steps),
            "launch": launch,
            "steps": {s.name: [s.start, s.end] for s in recorder.steps.values()
                      if not s.type.startswith(("kimipd:", "pulumi:"))},
            "up_seconds": wall,
            "serving_at": spans["smoke test"][1],
            "preparation_done_at": max(spans[p][1] for p in NODE_PREPARATION if p in spans),
            "phases": {phase: {"start": start, "end": end, "seconds": end - start}
                       for phase, (start, end) in spans.items()},
            # > 0: decode containers were created that long before prefill was healthy.
            "decode_lead_seconds": prefill_healthy - decode_start,
            "event_lag_seconds": max(recorder.lag, default=0.0),
        }
        log(f"B1 {order} run {run}: serving at {measured['serving_at']:.1f}s "
            f"(up {wall:.1f}s), decode lead {measured['decode_lead_seconds']:.1f}s")
        return measured, stack

    # -- B2: no-op up, preview, stack output ------------------------------------------------------

    def steady_state(self, stack: auto.Stack, runs: int) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"no-op up": [], "preview": [], "stack output": []}
        for _ in range(runs):
            wall, result = self.up(stack)
            assert set(result.summary.resource_changes or {}) == {"same"}, (
                result.summary.resource_changes)
            times["no-op up"].append(wall)
            started = time.monotonic()
            stack.preview(parallel=self.parallel)
            times["preview"].append(time.monotonic() - started)
            started = time.monotonic()
            subprocess.run([self.env["PULUMI_BIN"], "stack", "output", "--json", "--stack",
                            stack.name], cwd=self.project.directory, capture_output=True,
                           check=True, env=self.project.env)
            times["stack output"].append(time.monotonic() - started)
        log("B2: " + ", ".join(f"{k} {min(v):.1f}s" for k, v in times.items()))
        return times

    # -- B5: the scope of a decode-only edit ---------------------------------------------------

    def decode_edit_scope(self, stack: auto.Stack) -> dict[str, dict[str, int]]:
        values = self.project.directory / f"Pulumi.{stack.name}.yaml"
        kept = values.read_text()
        groups = self.values()["groups"]
        groups["decode"]["extraArgs"] = ["--mem-fraction-static", "0.80",
                                         "--max-running-requests", "32"]
        self.project.update_stack(stack.name, {"groups": groups})
        recorder = Recorder()
        try:
            stack.preview(on_event=recorder, parallel=self.parallel)
        finally:
            values.write_text(kept)
        counts = change_counts(recorder.ops)
        log(f"B5: {counts}")
        return counts

    # -- B3: node preparation by cluster size -------------------------------------------------

    def preparation_values(self, size: int) -> dict[str, Any]:
        """serving false on the first SIZE nodes, half prefill, half decode. (One node is not a
        stack: the model refuses a prefill and a decode group on one node's GPUs.)"""
        values = self.values()
        nodes = NODES[:size]
        values["nodes"] = [{"address": address, "gpus": 8} for address in nodes]
        values["serving"] = False
        prefill, decode = nodes[:size // 2], nodes[size // 2:]
        values["groups"]["prefill"] |= {"nodes": prefill, "tpSize": 8 * len(prefill),
                                        "epSize": 8 * len(prefill)}
        values["groups"]["decode"] |= {"nodes": decode, "tpSize": 8 * len(decode),
                                       "epSize": 8 * len(decode)}
        values["mooncakeMaster"]["node"] = nodes[0]
        values["router"]["node"] = decode[0]
        return values

    def preparation(self, size: int, run: int) -> dict[str, Any]:
        stack = self.new_stack(f"b3-{size}-{run}", self.preparation_values(size))
        recorder = Recorder()
        try:
            wall, _ = self.up(stack, recorder)
        finally:
            self.drop(stack)
        preflight = [s.end - s.start for s in recorder.steps.values()
                     if s.name.endswith("-preflight") and s.end is not None]
        measured = {"size": size, "up_seconds": wall,
                    "preflight_step_seconds": sum(preflight) / len(preflight),
                    "phases": {p: end - start for p, (start, end) in recorder.spans().items()}}
        log(f"B3 {size} node(s) run {run}: {wall:.1f}s "
            f"(preflight step {measured['preflight_step_seconds']:.1f}s)")
        return measured


def run_sim_benchmarks(work: Path, *, runs: int, load_seconds: float, parallel: int | None,
                       gate_interval: int | None, only: set[str],
                       orders: tuple[str, ...] = ORDERS) -> dict[str, Any]:
    bench = SimBench(work, load_seconds=load_seconds, parallel=parallel,
                     gate_interval=gate_interval)
    results: dict[str, Any] = {"image": bench.sim["KIMIPD_SIM_IMAGE"]}
    bench.remove_containers()
    try:
        if only & {"B1", "B2", "B5"}:
            # Interleaved, so that a slow spell of the machine hits both orders alike.
            if "B1" not in only:
                orders = orders[-1:]
            b1: dict[str, list[dict[str, Any]]] = {order: [] for order in orders}
            kept = None
            for run in range(runs if "B1" in only else 1):
                for order in orders:
                    if kept is not None:
                        bench.drop(kept)
                    measured, kept = bench.time_to_serve(order, run)
                    b1[order].append(measured)
            assert kept is not None
            try:
                if "B1" in only:
                    results["B1"] = b1
                if "B2" in only:
                    deployment = kept.export_stack().deployment
                    assert deployment is not None, "the exported stack has no deployment"
                    state = deployment["resources"]
                    results["B2"] = {"resources": len(state),
                                     "seconds": bench.steady_state(kept, runs)}
                if "B5" in only:
                    results["B5"] = bench.decode_edit_scope(kept)
            finally:
                bench.drop(kept)
        if "B3" in only:
            results["B3"] = {size: [bench.preparation(size, run) for run in range(runs)]
                             for size in PREPARATION_SIZES}
    finally:
        bench.remove_containers()
    return results


def docker_time(text: str) -> float:
    """docker's RFC 3339 time (nanoseconds, Z) -> Unix seconds."""
    stamp = text.strip().replace("Z", "+00:00")
    if "." in stamp:
        head, tail = stamp.split(".", 1)
        digits = tail[:tail.index("+")]
        stamp = f"{head}.{digits[:6].ljust(6, '0')}{tail[len(digits):]}"
    return datetime.fromisoformat(stamp).timestamp()
