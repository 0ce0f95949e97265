"""Planned changes that keep serving, through the real engine on the sim with the rust router
(stack file Pulumi.sim-2p2d.yaml): the worker API refuses a caller without the key; restarting
one decode group fails no request under bounded load, and the router never has zero groups of a
mode; a new checkpoint's rollout Ctrl-C'd midway, raced by reconcile, reverted, then rolled in
halves never pairs a prefill and a decode of two; a failing canary stops the rollout while the
groups not yet replaced keep serving. Tests run in file order on one stack, which test_heal.py
goes on with."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from pulumi import automation as auto

from sim.automation import Project
from tests.conftest import REPO
from tests.integration.engine import (  # noqa: F401 - fixtures
    AUTHORIZED, ROUTER, SHARED_2P2D, StreamingLoad, assert_replaced_only, container_ids, kimipd,
    shared_2p2d,
    shared_2p2d_project, shared_2p2d_sim, shared_2p2d_stack, shared_2p2d_values, up_under_load)
from tests.integration.healing import reconcile_once
from tests.integration.sim import SimCluster

pytestmark = pytest.mark.timeout(1800)

PREFILL = {"prefill-a": "http://10.231.60.1:30000", "prefill-b": "http://10.231.60.3:30000"}
DECODE = {"decode-a": "http://10.231.60.5:30000", "decode-b": "http://10.231.60.7:30000"}


def workers(headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(ROUTER + "/workers", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as refused:
        return refused.code, {}


class WorkerWatch:
    """GET /workers every 0.2 s while an `up` runs: the fewest healthy groups of each mode the
    router had, and when each group left and came back."""

    def __init__(self) -> None:
        self.fewest = {"prefill": 99, "decode": 99}
        # (when, healthy "url|mode" entries), None while the router does not answer
        self.seen: list[tuple[float, frozenset[str] | None]] = []
        self.unanswered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, listing = workers(AUTHORIZED)
            except OSError:
                status, listing = 0, {}
            if status != 200:
                self.unanswered += 1
                for mode in self.fewest:
                    self.fewest[mode] = 0
                if not self.seen or self.seen[-1][1] is not None:
                    self.seen.append((time.monotonic(), None))
            else:
                healthy = frozenset(w["url"] + "|" + w["worker_type"]
                                    for w in listing.get("workers", []) if w.get("is_healthy"))
                for mode in self.fewest:
                    count = sum(1 for entry in healthy if entry.endswith("|" + mode))
                    self.fewest[mode] = min(self.fewest[mode], count)
                if not self.seen or self.seen[-1][1] != healthy:
                    self.seen.append((time.monotonic(), healthy))
            time.sleep(0.2)

    def __enter__(self) -> WorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(5)

    def absent(self, url: str, mode: str) -> list[int]:
        """Indices of the snapshots in which URL was not a healthy worker."""
        return [i for i, (_, healthy) in enumerate(self.seen)
                if healthy is None or f"{url}|{mode}" not in healthy]

    def serving(self, index: int) -> bool:
        """The router answered with a healthy group of each mode."""
        healthy = self.seen[index][1]
        return healthy is not None and all(any(entry.endswith("|" + mode) for entry in healthy)
                                           for mode in ("prefill", "decode"))


def test_the_worker_api_and_generate_need_the_key(stack: auto.Stack) -> None:
    assert workers()[0] == 401, "GET /workers answered a caller without the key"
    status, listing = workers(AUTHORIZED)
    assert status == 200
    healthy = {w["url"]: w["worker_type"] for w in listing["workers"] if w["is_healthy"]}
    assert healthy == {**{url: "prefill" for url in PREFILL.values()},
                       **{url: "decode" for url in DECODE.values()}}
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode()
    request = urllib.request.Request(ROUTER + "/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    outputs = stack.outputs()
    assert outputs["routerApiKey"].secret
    targets = {entry["labels"]["role"] for entry in outputs["prometheusTargets"].value}
    assert {"door", "router"} <= targets


def test_restarting_one_decode_group_fails_no_request(stack: auto.Stack, project: Project,
                                                      sim: SimCluster) -> None:
    before = container_ids(sim)
    groups = shared_2p2d_values(sim)["groups"]
    groups["decode-b"]["restartGeneration"] = 1
    project.update_stack(SHARED_2P2D, {"groups": groups})
    with WorkerWatch() as watch:
        _, results = up_under_load(stack, "decode-b restart through the rust router")
    failed = [status for status in results if status != 200]
    assert len(results) > 20 and not failed, f"{len(failed)} of {len(results)} failed: {failed[:10]}"
    assert watch.fewest == {"prefill": 2, "decode": 1}, watch.fewest
    assert watch.absent(DECODE["decode-b"], "decode"), "decode-b was never drained"
    assert not watch.absent(DECODE["decode-a"], "decode")
    assert_replaced_only(before, container_ids(sim), "kimipd-decode-b-")


NEW_CHECKPOINT = "/data/models/Kimi-K3-0912"
# The node that builds test images (it pushes them to the sim's registry).
SIM_BUILDER = "10.231.60.1"


class Everywhere:
    """StreamingLoad through router.node's door and, beside it, a slower one straight to each
    slot and to the other door node's own door (where the virtual IP goes when router.node is
    lost): a slot that pairs two contracts shows there even while router.node's door keeps it
    drained. Only router.node's door must not fail a request; every answer anywhere must be of
    one contract."""

    def __init__(self, stack: auto.Stack) -> None:
        door = stack.outputs()["door"].value
        self.direct = {f"slot {name}": slot["url"] for name, slot in door["slots"].items()}
        self.direct |= {f"door on {node}": f"http://{node}:{ROUTER.rsplit(':', 1)[1]}"
                        for node in door.get("nodes") or {} if node != door["node"]}
        self.door = StreamingLoad(rate=5.0)
        self.others = {what: StreamingLoad(rate=1.0, url=url) for what, url in self.direct.items()}

    def __enter__(self) -> Everywhere:
        for load in (self.door, *self.others.values()):
            load.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        for load in (self.door, *self.others.values()):
            load.__exit__()

    def mixed(self) -> dict[str, int]:
        return {what: len(load.mixed()) for what, load in
                (("door", self.door), *self.others.items()) if load.mixed()}

    def summary(self, what: str) -> str:
        return "; ".join([self.door.summary(f"{what}, through router.node's door")]
                         + [load.summary(name) for name, load in self.others.items()])


def assert_one_contract_served(load: Everywhere, watch: WorkerWatch, what: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """The figures printed (the run's log keeps them: docs/router.md); no answer anywhere of
    two contracts, none through router.node's door failed, a group of each mode there at the
    fewest."""
    with capsys.disabled():
        print(f"\n{load.summary(what)}; fewest healthy through router.node's door: "
              f"{watch.fewest}")
    assert load.mixed() == {}, f"answers of two contracts: {load.mixed()}"
    failed = load.door.failed()
    assert len(load.door.results) > 50 and not failed, [answer.outcome for answer in failed]
    assert watch.fewest["prefill"] >= 1 and watch.fewest["decode"] >= 1, watch.fewest


def assert_all_replaced_but_the_doors(before: dict[str, str], after: dict[str, str]) -> None:
    kept = [name for name in before if name.startswith(("kimipd-door", "kimipd-keepalived"))]
    assert {name: after[name] for name in kept} == {name: before[name] for name in kept}, \
        "a door or keepalived was replaced"
    assert all(after[name] != before[name] for name in before if name not in kept), \
        "a container was not replaced"


def record_place(stack: auto.Stack) -> tuple[str, str]:
    """Where the rollout's record is: router.node and its state directory (read from the
    outputs before an `up`: the state file is not read while an update writes it)."""
    door = stack.outputs()["door"].value
    return door["node"], f"{door['stateDir']}/rollout.json"


def rollout_record(sim: SimCluster, place: tuple[str, str]) -> dict:
    answer = sim.ssh(place[0], f"cat {place[1]}", timeout=30)
    return json.loads(answer.stdout) if answer.returncode == 0 and answer.stdout.strip() else {}


def interrupted_up(project: Project, stack: auto.Stack, sim: SimCluster, log: Path,
                   when) -> tuple[float, dict, str]:
    """`kimipd up --yes` Ctrl-C'd (SIGINT to its process group, as a terminal sends it) once
    WHEN(the rollout's record) holds: seconds from the Ctrl-C to its exit, the record then, and
    what it printed (into LOG: a pipe nobody reads while it runs could fill and stall it)."""
    place = record_place(stack)
    with log.open("w") as output:
        process = subprocess.Popen(
            [str(REPO / "scripts" / "kimipd"), "-s", SHARED_2P2D, "--cwd",
             str(project.directory), "up", "--yes"], stdout=output, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
            env=os.environ | project.env | {"COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 300
        record: dict = {}
        while time.monotonic() < deadline and process.poll() is None:
            record = rollout_record(sim, place)
            if record and when(record):
                break
            time.sleep(0.5)
        assert process.poll() is None, f"the up ended before the point to stop it: {record}"
        os.killpg(process.pid, signal.SIGINT)
        stopped = time.monotonic()
        process.wait(300)
        return time.monotonic() - stopped, record, log.read_text()
    finally:
        if process.poll() is None:
            # Never leave the shared stack locked for the modules after this one.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
            stack.cancel()


def slot_contracts(stack: auto.Stack, sim: SimCluster) -> dict[str, set[str]]:
    """Each slot's registrations, as the contracts the record says their groups run (not one
    smg drains for 5 s after its removal: it is never picked again)."""
    record = rollout_record(sim, record_place(stack))
    by_url = {url: record["groups"].get(group, "unrecorded")
              for group, url in (PREFILL | DECODE).items()}
    found = {}
    for name, slot in stack.outputs()["door"].value["slots"].items():
        request = urllib.request.Request(slot["url"] + "/workers", headers=AUTHORIZED)
        with urllib.request.urlopen(request, timeout=5) as response:
            found[name] = {by_url[w["url"]] for w in json.load(response)["workers"]
                           if w.get("status") != "draining"}
    return found


def test_a_new_checkpoint_stopped_midway_reconciled_reverted_then_rolled_never_mixes(
        stack: auto.Stack, project: Project, sim: SimCluster, tmp_path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`model.path` changed (a new checkpoint: both modes' KV contract) under load, the way an
    operator's rollout goes wrong: `kimipd up` Ctrl-C'd once a slot has left the door to take
    the new contract; a reconcile pass (it completed that slot with the old contract's groups
    before); the config reverted and `up` (back); then the change again and `up` (forward, in
    halves). No answer anywhere (router.node's door, each slot, the other door node's door)
    comes from a prefill and a decode of two checkpoints, none through router.node's door
    fails, and a slot serves throughout."""
    before = container_ids(sim)
    old_model = shared_2p2d_values(sim)["model"]
    project.update_stack(SHARED_2P2D, {"model": old_model | {"path": NEW_CHECKPOINT}})
    figures = []
    with WorkerWatch() as watch, Everywhere(stack) as load:
        time.sleep(2)
        started = time.monotonic()
        took, record, output = interrupted_up(
            project, stack, sim, tmp_path / "interrupted-up.log",
            lambda record: any(slot.get("converting") for slot in record["slots"].values()))
        figures.append(f"Ctrl-C at phase {record.get('phase')} ({time.monotonic() - started:.0f}s"
                       f" in): the up ended {took:.1f}s later")
        assert took < 60, f"the up went on {took:.0f}s after its Ctrl-C:\n{output[-3000:]}"
        assert "asking the update's node scripts to stop" in output, output[-3000:]
        held = slot_contracts(stack, sim)
        assert all(len(contracts) <= 1 for contracts in held.values()), held
        shown = kimipd(project, SHARED_2P2D, "rollout")
        assert shown.returncode == 1, shown.stdout + shown.stderr
        assert "phase converting" in shown.stdout or "phase split" in shown.stdout, shown.stdout
        assert "`scripts/kimipd up` takes it forward" in shown.stderr, shown.stderr
        code, decision = reconcile_once(project, SHARED_2P2D, tmp_path, "--grace-seconds", "0",
                                        "--human-window-minutes", "0")
        figures.append(f"reconcile: {decision['decision']}")
        assert decision["decision"] != "re-registered", decision
        held = slot_contracts(stack, sim)
        assert all(len(contracts) <= 1 for contracts in held.values()), held
        project.update_stack(SHARED_2P2D, {"model": old_model})
        stack.refresh()
        started = time.monotonic()
        stack.up(on_output=print)
        figures.append(f"reverted: up in {time.monotonic() - started:.0f}s")
        target = rollout_record(sim, record_place(stack))["target"]
        assert slot_contracts(stack, sim) == {"a": {target}, "b": {target}}
        project.update_stack(SHARED_2P2D, {"model": old_model | {"path": NEW_CHECKPOINT}})
        started = time.monotonic()
        stack.up(on_output=print)
        figures.append(f"forward: up in {time.monotonic() - started:.0f}s")
        time.sleep(2)
    with capsys.disabled():  # the run's log keeps the figures (docs/router.md)
        print(f"\n{'; '.join(figures)}")
    assert_one_contract_served(load, watch, "model.path stopped, back, forward", capsys)
    record = rollout_record(sim, record_place(stack))
    assert record["phase"] == "steady", record
    after = container_ids(sim)
    for name in before:
        if "-prefill-" in name or "-decode-" in name:
            assert after[name] != before[name], f"{name} was not replaced"
    for name in ("kimipd-door", "kimipd-router-a", "kimipd-router-b"):
        assert after[name] == before[name], f"{name} was replaced"
    # Each router holds the new checkpoint's four groups.
    status, listing = workers(AUTHORIZED)
    assert sum(1 for w in listing["workers"] if w["is_healthy"]) == 4, listing


def next_image(sim: SimCluster) -> str:
    """The sim's image rebuilt as another one (pushed to the sim's registry as `:next-TAG`): a
    new image id, and a new record of its build, so the stand-ins take it for another contract
    and mark an answer that pairs the two."""
    image = sim.image
    derived = f"{image.rsplit(':', 1)[0]}:next-{image.rsplit(':', 1)[1]}"
    dockerfile = f"FROM {image}\nRUN sed -i 's/^inputs=.*/&-next/' /etc/kimipd-sim-image\n"
    build = sim.ssh(SIM_BUILDER, f"docker pull -q {image} >/dev/null && printf %s "
                                 f"{shlex.quote(dockerfile)} | DOCKER_BUILDKIT=0 docker build "
                                 f"--network none -q -t {derived} - >/dev/null && "
                                 f"docker push -q {derived}", timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    return derived


def test_a_new_image_rolls_the_routers_and_the_groups_in_halves_and_never_mixes(
        stack: auto.Stack, project: Project, sim: SimCluster,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The most common change of contract: a new image. It replaces every container but the
    doors and keepalived (the slots' routers run the node's image too) and rolls in halves
    behind the door: no answer anywhere of two contracts, none through router.node's door
    fails, and that door has a group of each mode at every look."""
    before = container_ids(sim)
    image = next_image(sim)
    project.update_stack(SHARED_2P2D, {"image": image})
    started = time.monotonic()
    with WorkerWatch() as watch, Everywhere(stack) as load:
        time.sleep(2)
        stack.up(on_output=print)
        time.sleep(2)
    assert_one_contract_served(load, watch, f"image changed in {time.monotonic() - started:.0f}s",
                               capsys)
    unserved = [watch.seen[i] for i in range(len(watch.seen)) if not watch.serving(i)]
    assert not unserved, f"router.node's door answered without a group of each mode: {unserved}"
    assert_all_replaced_but_the_doors(before, container_ids(sim))
    # Every group drained and replaced, never both of a mode at once (the halves); this test
    # stands for any change that replaces every container (`restartGeneration` too: the same
    # steps, without the contract's halves).
    for mode, urls in (("prefill", PREFILL), ("decode", DECODE)):
        out = {name: watch.absent(url, mode) for name, url in urls.items()}
        assert all(out.values()), f"a {mode} group was never drained: {out}"
        first, second = sorted(out, key=lambda name: out[name][0])
        assert not set(out[first]) & set(out[second]), f"{mode}: both out at once: {out}"
    assert rollout_record(sim, record_place(stack))["phase"] == "steady"
    assert {name: len(contracts) for name, contracts in slot_contracts(stack, sim).items()} \
        == {"a": 1, "b": 1}
    status, listing = workers(AUTHORIZED)
    assert sum(1 for w in listing["workers"] if w["is_healthy"]) == 4, listing
    # The tests after this one go on with the new image (none of them changes it).
