"""Planned changes that keep serving, through the real engine on the sim with the rust router
(stack file Pulumi.sim-2p2d.yaml): the worker API refuses a caller without the key; restarting
one decode group fails no request under bounded load, and the router never has zero groups of a
mode; a new checkpoint rolls in halves and never pairs a prefill and a decode of two; a failing
canary stops the rollout while the groups not yet replaced keep serving. Tests run in file order on one stack, which test_heal.py
goes on with."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from pulumi import automation as auto

from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    AUTHORIZED, ROUTER, SHARED_2P2D, StreamingLoad, assert_replaced_only, container_ids, shared_2p2d,
    shared_2p2d_project, shared_2p2d_sim, shared_2p2d_stack, shared_2p2d_values, up_under_load)
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


def test_a_new_checkpoint_rolls_in_halves_and_never_pairs_two_contracts(
        stack: auto.Stack, project: Project, sim: SimCluster,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`model.path` changed (a new checkpoint: both modes' KV contract) under load: one slot
    leaves the door, takes the first new prefill and decode group and comes back; the other
    slot then moves on, and the other half follows. No answer comes from a prefill and a
    decode of two checkpoints (the decode stand-ins mark such an answer: bench/load.Answer.mixed),
    none fails, and half the groups of each mode serve at the fewest."""
    before = container_ids(sim)
    project.update_stack(SHARED_2P2D, {"model": shared_2p2d_values(sim)["model"] | {
        "path": "/data/models/Kimi-K3-0912"}})
    started = time.monotonic()
    with WorkerWatch() as watch, StreamingLoad(rate=5.0) as load:
        time.sleep(2)
        stack.up(on_output=print)
        time.sleep(2)
    with capsys.disabled():  # the run's log keeps the figures (docs/router.md)
        print(f"\n{load.summary(f'model.path changed in {time.monotonic() - started:.0f}s')}; "
              f"fewest healthy through the door: {watch.fewest}")
    assert load.mixed() == [], f"{len(load.mixed())} answers of two checkpoints"
    failed = load.failed()
    assert len(load.results) > 50 and not failed, [answer.outcome for answer in failed]
    # Half of each mode at the fewest: the halves, never none.
    assert watch.fewest == {"prefill": 1, "decode": 1}, watch.fewest
    after = container_ids(sim)
    for name in before:
        if "-prefill-" in name or "-decode-" in name:
            assert after[name] != before[name], f"{name} was not replaced"
    for name in ("kimipd-door", "kimipd-router-a", "kimipd-router-b"):
        assert after[name] == before[name], f"{name} was replaced"
    # Each router holds the new checkpoint's four groups.
    status, listing = workers(AUTHORIZED)
    assert sum(1 for w in listing["workers"] if w["is_healthy"]) == 4, listing


def test_a_change_that_replaces_every_container_fails_nothing_behind_the_door(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    """The global restartGeneration replaces every container but the door: the router slots
    one at a time behind it, the groups one of a mode at a time. The door always has a slot
    with a group of each mode, so no request fails (without the door, the router's own swap
    failed 14 of 405: docs/door.md)."""
    before = container_ids(sim)
    project.update_stack(SHARED_2P2D, {"restartGeneration": 1})
    with WorkerWatch() as watch:
        _, results = up_under_load(stack, "restartGeneration (both slots and every group)")
    after = container_ids(sim)
    # Neither the doors nor keepalived carry the restart generation (docs/door.md).
    kept = [name for name in before if name.startswith(("kimipd-door", "kimipd-keepalived"))]
    assert {name: after[name] for name in kept} == {name: before[name] for name in kept}, \
        "a door or keepalived was replaced"
    assert all(after[name] != before[name] for name in before if name not in kept), \
        "a container was not replaced"
    failed = [status for status in results if status != 200]
    assert len(results) > 20 and not failed, f"{len(failed)} of {len(results)} failed: {failed[:10]}"
    unserved = [watch.seen[i] for i in range(len(watch.seen)) if not watch.serving(i)]
    assert not unserved, f"the door answered without a group of each mode: {unserved}"
    for mode, urls in (("prefill", PREFILL), ("decode", DECODE)):
        out = {name: watch.absent(url, mode) for name, url in urls.items()}
        assert all(out.values()), f"a {mode} group was never drained: {out}"
        first, second = sorted(out, key=lambda name: out[name][0])
        assert not set(out[first]) & set(out[second]), f"{mode}: both out at once: {out}"


def test_a_failing_canary_stops_the_rollout_and_the_rest_keep_serving(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    values = shared_2p2d_values(sim)
    groups = values["groups"]
    for name in DECODE:
        groups[name]["env"] = {"SGLANG_STANDIN_EXIT_WHILE_LOADING": "1"}
    project.update_stack(SHARED_2P2D, {"groups": groups})
    before = container_ids(sim)
    with pytest.raises(auto.CommandError) as failure:
        stack.up()
    message = str(failure.value)
    after = container_ids(sim)
    replaced = [name for name in DECODE
                if after.get(f"kimipd-{name}-r0") != before[f"kimipd-{name}-r0"]]
    assert len(replaced) == 1, f"the rollout went past its canary: {replaced}"
    canary = replaced[0]
    survivor = next(name for name in DECODE if name != canary)
    assert f"{survivor} keeps running and serving" in message, message[-3000:]
    assert f"{canary} holds the decode rollout lease" in message, message[-3000:]
    assert after[f"kimipd-{survivor}-r0"] == before[f"kimipd-{survivor}-r0"]
    status, listing = workers(AUTHORIZED)
    healthy = {w["url"] for w in listing["workers"] if w["is_healthy"]}
    assert DECODE[survivor] in healthy and DECODE[canary] not in healthy, healthy
    body = json.dumps({"text": "still", "sampling_params": {"max_new_tokens": 2}}).encode()
    for _ in range(5):
        request = urllib.request.Request(ROUTER + "/generate", data=body, headers={
            "Content-Type": "application/json", **AUTHORIZED})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    # Fixed config: the next `up` replaces the canary again, then rolls the rest.
    project.update_stack(SHARED_2P2D, {"groups": shared_2p2d_values(sim)["groups"]})
    stack.refresh()
    stack.up()
    status, listing = workers(AUTHORIZED)
    assert sum(1 for w in listing["workers"] if w["is_healthy"]) == 4, listing
