"""Faults an operator will meet, each through the real engine on the sim, each ending with a
converging `pulumi up` whose smoke test passes. Tests run in file order on one small stack (two
nodes per group, engine.small_values): none of these faults needs eight nodes, and the module runs
beside the 8-node ones."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulumi import automation as auto

from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    SMALL_ROUTER, Events, StreamingLoad, container_ids, env, kimipd, new_stack, project, small_sim,
    small_values, up_under_load)
from tests.integration.sim import SMALL_NODES, SimCluster

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    stack = new_stack(project, sim, "faults", small_values(sim))
    stack.up()
    yield stack
    stack.destroy()


def decode_generation(sim: SimCluster, generation: int) -> dict:
    """The module's groups with decode's own restartGeneration at GENERATION: a change that
    replaces decode's two ranks and nothing else."""
    groups = small_values(sim)["groups"]
    groups["decode"]["restartGeneration"] = generation
    return groups


def converges(stack: auto.Stack) -> dict:
    result = stack.up()
    assert result.outputs["smokeTest"].value.strip(), "the smoke test returned no text"
    return {key: value.value for key, value in result.outputs.items()}


def all_running(sim: SimCluster) -> dict[str, str]:
    ids = container_ids(sim)
    # 4 ranks and the mc-master, the door and its two router slots
    assert len(ids) == 8 and all(v.endswith("running") for v in ids.values()), ids
    return ids


def state_container_ids(stack: auto.Stack) -> set[str]:
    deployment = stack.export_stack().deployment
    return {resource.get("id", "") for resource in deployment.get("resources", [])
            if resource.get("type") == "docker:index/container:Container"}


def orphans_found_and_removed(project: Project, stack: auto.Stack, sim: SimCluster) -> set[str]:
    """`scripts/kimipd orphans`: its verdict against this test's own reading of the state and
    the nodes, then `--remove`, then a clean bill. Returns the containers it removed."""
    known = state_container_ids(stack)
    unknown = {name for name, id_state in container_ids(sim).items()
               if not any(full.startswith(id_state.split()[0]) for full in known)}
    listing = kimipd(project, "faults", "orphans", "--json")
    report = json.loads(listing.stdout)
    assert {o["container"] for o in report["orphans"]
            if o["reason"] == "not in the stack's state"} == unknown
    # Each orphan's group goes whole: every rank of it on the nodes is listed.
    groups = {o["group"] for o in report["orphans"] if o["group"]}
    assert {o["container"] for o in report["orphans"] if o["group"]} == {
        name for name in container_ids(sim) if name.rsplit("-r", 1)[0][len("kimipd-"):] in groups}
    assert listing.returncode == (1 if unknown else 0)
    assert kimipd(project, "faults", "orphans", "--remove").returncode == 0
    listed = {o["container"] for o in report["orphans"]}
    assert not listed & set(container_ids(sim))
    assert kimipd(project, "faults", "orphans").returncode == 0
    return listed


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    return parents


def _command(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


def _running(pid: int) -> bool:
    """PID exists and is not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def pulumi_children() -> list[int]:
    """The CLI processes the Automation API started from this test process."""
    return [pid for pid, parent in _parents().items()
            if parent == os.getpid() and _command(pid).endswith(b"pulumi")]


def descendants(roots: list[int]) -> list[int]:
    """Every process below ROOTS (the CLI's plugins and language host, and theirs)."""
    parents = _parents()
    found, frontier = [], set(roots)
    while frontier:
        children = {pid for pid, parent in parents.items() if parent in frontier}
        found += sorted(children)
        frontier = children
    return found


class UpInBackground:
    """`stack.up()` in a thread, so the test can signal the CLI while a gate waits."""

    def __init__(self, stack: auto.Stack) -> None:
        self.events = Events()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, args=(stack,), daemon=True)
        self.thread.start()

    def _run(self, stack: auto.Stack) -> None:
        try:
            stack.up(on_event=self.events)
        except Exception as error:  # noqa: BLE001 - handed to the test
            self.error = error

    def wait_for_step(self, name: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(phase == "pre" and urn.endswith("::" + name)
                   for phase, _, urn in self.events.steps):
                return
            time.sleep(0.2)
        raise AssertionError(f"{name} never started: {self.events.steps[-5:]}")

    def join(self, timeout: float = 600) -> Exception | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "pulumi up did not end"
        return self.error


def test_a_missing_image_fails_up_before_any_serving_container_changes(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    before = all_running(sim)
    missing = sim.image.rsplit(":", 1)[0] + ":no-such-tag"
    project.update_stack("faults", {"image": missing})
    preview = stack.preview()
    # at least each node's image and each rank
    assert preview.change_summary.get("replace", 0) + preview.change_summary.get("create", 0) >= 8
    with pytest.raises(auto.CommandError) as error:
        stack.up()
    assert "no-such-tag" in str(error.value)
    assert all_running(sim) == before, "a container of the previous generation was touched"
    project.update_stack("faults", {"image": sim.image})
    converges(stack)
    assert all_running(sim) == before


def test_an_unreachable_node_is_named_and_up_converges_once_it_is_back(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    # decode's own generation: an `up` that must reach the node, and replaces decode alone
    # (the global one replaced every container, the router's slots one at a time, for nothing
    # this test is about).
    project.update_stack("faults", {"groups": decode_generation(sim, 1)})
    decode_node = SMALL_NODES[3]  # decode's rank 1 (not the router's node)
    number = int(decode_node.rsplit(".", 1)[1])
    sim.stop_sshd(number)
    try:
        with pytest.raises(auto.CommandError) as error:
            stack.up()
        assert decode_node in str(error.value)
    finally:
        sim.start_node(number)
    stack.refresh()
    converges(stack)
    ids = all_running(sim)
    labels = sim.docker(decode_node, "inspect", "--format",
                        '{{index .Config.Labels "kimipd.group-restart-generation"}}',
                        "kimipd-decode-r1")
    assert labels.stdout.strip() == "1" and len(ids) == 8


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_up_interrupted_while_a_gate_waits_recovers(stack: auto.Stack, project: Project,
                                                    sim: SimCluster, signal_name: str) -> None:
    """SIGINT: the CLI cancels gracefully and releases its lock; SIGKILL leaves the lock and
    pending operations: `pulumi cancel`, then `refresh --clear-pending-creates`
    (docs/troubleshooting.md)."""
    groups = decode_generation(sim, {"SIGINT": 2, "SIGKILL": 3}[signal_name])
    # Long enough that the signal lands while decode's gate waits (2 s after it starts), short
    # because every later `up` of this module loads decode for as long.
    groups["decode"]["env"] = {"SGLANG_STANDIN_LOAD_SECONDS": "10"}
    project.update_stack("faults", {"groups": groups})
    up = UpInBackground(stack)
    up.wait_for_step("decode-r0-health")
    time.sleep(2)
    cli = pulumi_children()
    below = descendants(cli)
    for pid in cli:
        os.kill(pid, getattr(signal, signal_name))
    error = up.join()
    assert error is not None, f"pulumi up survived {signal_name}"
    if signal_name == "SIGKILL":
        # A killed CLI leaves its plugins running (re-parented to init); they are this fault's
        # processes, so the test stops them and checks none is left.
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (left := [pid for pid in below if _running(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes of the killed CLI still running: {left}"
    if signal_name == "SIGKILL":
        with pytest.raises(auto.CommandError) as locked:
            stack.up()
        if "failed to load checkpoint: EOF" in str(locked.value):
            # The kill landed while the file backend rewrote the checkpoint's attributes file,
            # which it writes in place (the checkpoint itself goes by rename): an empty
            # STACK.json.attrs. Removing it is the recovery (docs/troubleshooting.md); the lock
            # is then what refuses the next `up`, as after any kill.
            empty = [path for path in project.state.rglob("faults.json*.attrs")
                     if path.stat().st_size == 0]
            assert empty, str(locked.value)
            for path in empty:
                path.unlink()
            with pytest.raises(auto.CommandError) as locked:
                stack.up()
        assert "locked" in str(locked.value)
        stack.cancel()
        # Containers the killed run had created are not in the state; with fixed names the next
        # create would collide with them. Their group goes whole (a rank the state knows would
        # be left alone and hang): docs/troubleshooting.md.
        orphans_found_and_removed(project, stack, sim)
        stack.refresh(clear_pending_creates=True)
    converges(stack)
    all_running(sim)


def test_a_container_the_state_does_not_know_is_removed_with_its_group(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    """What a killed `up` can leave, made on purpose: decode-r1 replaced behind the state's back
    by a container of the same name. `refresh` would drop the state's decode-r1 and `up` collide
    with the name; `kimipd orphans --remove` takes the whole decode group, and `up` restarts it."""
    node = SMALL_NODES[3]
    image = sim.docker(node, "inspect", "--format", "{{.Config.Image}}",
                       "kimipd-decode-r1").stdout.strip()
    sim.docker(node, "rm", "-f", "kimipd-decode-r1")
    sim.docker(node, "run", "-d", "--name", "kimipd-decode-r1", "--network", "none",
               "--label", "kimipd.role=decode-r1", "--label", "kimipd.group=decode",
               "--entrypoint", "sleep", image, "600")
    before = container_ids(sim)
    assert orphans_found_and_removed(project, stack, sim) == {
        f"kimipd-decode-r{rank}" for rank in range(2)}
    after = container_ids(sim)
    assert {name: before[name] for name in after} == after  # nothing else touched
    stack.refresh()
    converges(stack)
    all_running(sim)


def test_a_second_up_on_the_same_stack_is_refused_by_the_lock(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    groups = decode_generation(sim, 4)
    groups["decode"]["env"] = {"SGLANG_STANDIN_LOAD_SECONDS": "10"}
    project.update_stack("faults", {"groups": groups})
    first = UpInBackground(stack)
    # The first `up` holds the lock from its start to its end; decode's gate is its middle.
    first.wait_for_step("decode-r0-health")
    with pytest.raises(auto.CommandError) as error:
        stack.up()
    assert "locked" in str(error.value)
    assert first.join() is None, f"the first up was harmed: {first.error}"
    all_running(sim)


def test_a_new_checkpoint_on_1p1d_is_an_outage_that_never_pairs_two(
        stack: auto.Stack, project: Project, sim: SimCluster,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`model.path` changed on one group of each mode (both modes' KV contract) under load:
    no router may hold both checkpoints, so nothing serves from prefill's drain until the new
    decode is admitted (the outage the review names), and no answer pairs the two (the decode
    stand-ins mark such an answer)."""
    model = small_values(sim)["model"] | {"path": "/data/models/Kimi-K3-0912"}
    # The groups as the module began (the lock test left decode loading for 10 s): the same
    # `up` replaces both groups anyway.
    project.update_stack("faults", {"model": model, "groups": small_values(sim)["groups"]})
    started = time.monotonic()
    with StreamingLoad(rate=5.0, url=SMALL_ROUTER) as load:
        time.sleep(2)
        stack.up()
        time.sleep(3)
    failed = load.failed()
    outage = (failed[-1].sent - failed[0].sent) if failed else 0.0
    with capsys.disabled():  # the run's log keeps the figures (docs/router.md)
        print(f"\n{load.summary(f'1P1D model.path changed in {time.monotonic() - started:.0f}s')}"
              f"; failures sent within {outage:.1f}s")
    assert load.mixed() == [], f"{len(load.mixed())} answers of two checkpoints"
    # Serving again after the rollout: the last answers are whole.
    assert load.results[-1].ok, load.results[-1].outcome
    all_running(sim)


def test_requests_during_a_router_only_change(stack: auto.Stack, project: Project,
                                              sim: SimCluster) -> None:
    """A bounded load through the door while `up` replaces only the router: its two slots go
    one at a time, each drained at the door first, so no request fails; the door itself stays."""
    values = small_values(sim)
    values["router"]["extraArgs"] = ["--log-level", "warn"]
    before = container_ids(sim)
    project.update_stack("faults", {"router": values["router"]})
    events, results = up_under_load(stack, "router-only change", router=SMALL_ROUTER)
    failed = [status for status in results if status != 200]
    assert {"router-a", "router-b", "smoke-test-generate"} <= events.changed()
    assert "door" not in events.changed()
    assert not {name for name in events.changed() if "prefill-r" in name or "decode-r" in name}
    assert len(results) > 20 and not failed, f"{len(failed)} of {len(results)} failed: {failed[:10]}"
    after = container_ids(sim)
    assert after["kimipd-door"] == before["kimipd-door"]
    assert after["kimipd-router-a"] != before["kimipd-router-a"]
