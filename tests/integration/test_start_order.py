"""`startOrder` for real: the engine on the sim, both orders, a prefill bootstrap port held late.

The prefill stand-in opens its bootstrap port SGLANG_STANDIN_BOOTSTRAP_DELAY_SECONDS after it
starts and loads for PREFILL_LOAD seconds; decode loads for DECODE_LOAD. The times compared are
the nodes' own docker records (`.Created`, `docker logs --timestamps`; one clock, the sim's nodes
share the machine's). The sim image may predate the delay knob, so the stacks ship the working
tree's stand-in as a node-file wheel, which assets/launch.sh installs in every rank before it
starts. Needs the sim up (never started or stopped here) and the provider plugins; run it under
`flock -o /tmp/kimipd-sim-tests.lock`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pulumi import automation as auto

from bench.sim_bench import docker_time as docker_seconds
from sim.automation import Project
from tests.conftest import REPO
from tests.integration.engine import (  # noqa: F401 - fixtures
    CONTAINER, Events, container_ids, env, new_stack, small_sim, small_values, with_minilb)
from tests.integration.sim import SMALL_NODES, SimCluster

pytestmark = pytest.mark.timeout(1200)

# A small stack (engine.small_values: two nodes per group), beside the 8-node modules.
PREFILL, DECODE = SMALL_NODES[:2], SMALL_NODES[2:]
BOOTSTRAP_DELAY = 6
PREFILL_LOAD = 20
DECODE_LOAD = 4
BOOTSTRAP_LINE = "Starting bootstrap server on"
READY_BANNER = "The server is fired up and ready to roll!"


@pytest.fixture(scope="module")
def standin_wheel(tmp_path_factory) -> Path:
    """The working tree's stand-in as a wheel (the in-tree backend builds it offline)."""
    directory = tmp_path_factory.mktemp("standin-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(directory), str(REPO / "sim" / "standin")],
                   check=True, timeout=300)
    (wheel,) = directory.glob("*.whl")
    return wheel


def values_for(sim: SimCluster, wheel: Path, order: str) -> dict:
    # MiniLB: the router starts once every group is ready (engine.with_minilb).
    values = with_minilb(small_values(sim))
    values["startOrder"] = order
    values["nodeFiles"].append({"source": str(wheel),
                                "destination": f"/var/lib/kimipd-sim/files/{wheel.name}"})
    values["groups"]["prefill"]["env"] = {
        "SGLANG_STANDIN_LOAD_SECONDS": str(PREFILL_LOAD),
        "SGLANG_STANDIN_BOOTSTRAP_DELAY_SECONDS": str(BOOTSTRAP_DELAY)}
    values["groups"]["decode"]["env"] = {"SGLANG_STANDIN_LOAD_SECONDS": str(DECODE_LOAD)}
    return values


def docker_time(text: str) -> datetime:
    """docker's RFC 3339 time with nanoseconds -> an aware datetime (the bench's parser)."""
    return datetime.fromtimestamp(docker_seconds(text), timezone.utc)


def created(sim: SimCluster, node: str, container: str) -> datetime:
    result = sim.docker(node, "inspect", "--format", "{{.Created}}", container)
    assert result.returncode == 0, result.stderr
    return docker_time(result.stdout)


def logged(sim: SimCluster, node: str, container: str, text: str) -> datetime:
    """When the container printed the first line containing TEXT (docker's own timestamp)."""
    result = sim.docker(node, "logs", "--timestamps", container)
    for line in (result.stdout + result.stderr).splitlines():
        if text in line:
            return docker_time(line.split(" ", 1)[0])
    raise AssertionError(f"{container} on {node} never logged {text!r}:\n"
                         + (result.stdout + result.stderr)[-3000:])


@pytest.fixture(scope="module")
def project(env, sim: SimCluster, tmp_path_factory) -> Project:
    return Project(tmp_path_factory.mktemp("kimipd-start-order"), env)


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster, standin_wheel: Path) -> Iterator[auto.Stack]:
    stack = new_stack(project, sim, "order", values_for(sim, standin_wheel, "overlapped"))
    yield stack
    stack.destroy()
    stack.workspace.remove_stack("order")


def test_overlapped_decode_waits_for_the_late_bootstrap_port_not_for_prefill_health(
        stack: auto.Stack, sim: SimCluster) -> None:
    events = Events()
    result = stack.up(on_event=events)
    assert result.outputs["smokeTest"].value.strip()
    prefill_created = created(sim, PREFILL[0], "kimipd-prefill-r0")
    bootstrap_open = logged(sim, PREFILL[0], "kimipd-prefill-r0", BOOTSTRAP_LINE)
    prefill_ready = logged(sim, PREFILL[0], "kimipd-prefill-r0", READY_BANNER)
    decode_ready = logged(sim, DECODE[0], "kimipd-decode-r0", READY_BANNER)
    held = (bootstrap_open - prefill_created).total_seconds()
    assert held >= BOOTSTRAP_DELAY, f"prefill-r0 opened its bootstrap port after {held:.1f}s"
    for rank, node in enumerate(DECODE):
        decode_created = created(sim, node, f"kimipd-decode-r{rank}")
        # The gate held decode back until the port opened...
        assert decode_created > bootstrap_open, (
            f"decode-r{rank} created at {decode_created}, before prefill-r0's bootstrap server "
            f"started at {bootstrap_open}")
        # ...and no longer: decode loaded while prefill was still loading.
        assert decode_created < prefill_ready, (
            f"decode-r{rank} created at {decode_created}, after prefill turned ready at "
            f"{prefill_ready}: no overlap")
    router_created = created(sim, DECODE[0], "kimipd-router")
    assert router_created > max(prefill_ready, decode_ready), (
        f"router created at {router_created}; prefill ready {prefill_ready}, decode ready "
        f"{decode_ready}")
    # The engine's own order: every rank's health check done before the router is created.
    router_starts = events.index("pre", "create", "router", CONTAINER)
    for group, nodes in (("prefill", PREFILL), ("decode", DECODE)):
        for rank in range(len(nodes)):
            assert events.index("done", "create", f"{group}-r{rank}-health") < router_starts
    state = stack.export_stack().deployment["resources"]
    (check,) = [r for r in state if r["urn"].endswith("::prefill-r0-bootstrap")]
    # The stand-in's bootstrap /health answers 200, as SGLang's does; any answer would pass.
    last = check["outputs"]["stdout"].splitlines()[-1]
    assert last.startswith(("kimipd-prefill-r0: healthy after", "kimipd-prefill-r0: answering "
                            "after")) and f"http://{PREFILL[0]}:8998/health" in last, last


def test_switching_to_sequential_replaces_no_container(stack: auto.Stack, project: Project,
                                                        sim: SimCluster) -> None:
    before = container_ids(sim)
    project.update_stack("order", {"startOrder": "sequential"})
    events = Events()
    stack.up(on_event=events)
    assert events.changed() == {"prefill-bootstrap", "prefill-r0-bootstrap"}, events.changed()
    assert container_ids(sim) == before


def test_sequential_decode_starts_after_prefill_is_healthy(stack: auto.Stack, project: Project,
                                                          sim: SimCluster) -> None:
    # A new generation replaces every container, in the stack's (now sequential) order.
    project.update_stack("order", {"restartGeneration": 1})
    result = stack.up()
    assert result.outputs["smokeTest"].value.strip()
    prefill_ready = logged(sim, PREFILL[0], "kimipd-prefill-r0", READY_BANNER)
    decode_ready = logged(sim, DECODE[0], "kimipd-decode-r0", READY_BANNER)
    for rank, node in enumerate(DECODE):
        decode_created = created(sim, node, f"kimipd-decode-r{rank}")
        assert decode_created > prefill_ready, (
            f"decode-r{rank} created at {decode_created}, before prefill was ready at "
            f"{prefill_ready}")
    assert created(sim, DECODE[0], "kimipd-router") > decode_ready


def test_switching_back_to_overlapped_only_adds_the_bootstrap_gate(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    before = container_ids(sim)
    project.update_stack("order", {"startOrder": "overlapped"})
    events = Events()
    stack.up(on_event=events)
    assert events.changed() == {"prefill-bootstrap", "prefill-r0-bootstrap"}, events.changed()
    assert container_ids(sim) == before
    assert stack.outputs()["smokeTest"].value.strip()
