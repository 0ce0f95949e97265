"""Failures bigger than one process, on the sim through the real engine: sim-2p2d with the door
(HAProxy, two keyed rust slots) under a bounded load of 10 requests/s, half streamed. One stack,
one `up`, then in order: every decode group killed at once and healed by `kimipd reconcile
--watch` with no person; a node whose link is cut taken out with one `kimipd up` that never
contacts it, then put back; each under load, with the failed requests counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulumi import automation as auto

from sim.automation import Project
from tests.conftest import REPO
from tests.integration.engine import (  # noqa: F401 - fixtures
    AUTHORIZED, StreamingLoad, env, kimipd, new_stack, project, sim, sim_values)
from tests.integration.sim import SimCluster

STACK = "lost"
ROUTER_NODE = "10.231.60.5"
SLOTS = {"a": "http://10.231.60.5:31001", "b": "http://10.231.60.5:31002"}
DECODE_RANK0 = {"decode-a": ("10.231.60.5", 30000), "decode-b": ("10.231.60.7", 30000)}
LOST = "10.231.60.7"  # decode-b's rank 0


def lost_values(sim: SimCluster, out: str | None = None) -> dict:
    values = sim_values(sim, "sim-2p2d", door=True)
    values["container"]["env"] = {**values["container"]["env"],
                                  "SGLANG_STANDIN_DECODE_TOKENS_PER_S": "26"}
    for node in values["nodes"]:
        if node["address"] == out:
            node["out"] = True
    return values


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    stack = new_stack(project, sim, STACK, lost_values(sim))
    stack.up(on_output=print)
    yield stack
    set_link(LOST, up=True)
    project.write_stack(STACK, lost_values(sim))
    stack.destroy(on_output=print)


def set_link(address: str, up: bool) -> None:
    """The host side of the node's veth on the sim bridge (sim/sim: kpdvN for 10.231.60.N)."""
    link = "kpdv" + address.rsplit(".", 1)[-1]
    subprocess.run(["ip", "link", "set", link, "up" if up else "down"], check=True)


def healthy_in_slots() -> dict[str, set[str]]:
    """slot -> the worker URLs it lists healthy (GET /workers with the key; {} if it does not
    answer)."""
    seen = {}
    for slot, url in SLOTS.items():
        request = urllib.request.Request(url + "/workers", headers=AUTHORIZED)
        try:
            with urllib.request.urlopen(request, timeout=3) as response:
                workers = json.load(response)["workers"]
        except (OSError, ValueError, KeyError):
            workers = []
        seen[slot] = {w["url"] for w in workers if w.get("is_healthy")}
    return seen


def group_url(group: str) -> str:
    host, port = DECODE_RANK0[group]
    return f"http://{host}:{port}"


def wait_for(predicate, seconds: float, what: str, every: float = 0.5) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if predicate():
            return time.monotonic() - started
        time.sleep(every)
    raise AssertionError(f"not within {seconds:.0f}s: {what}")


def test_every_decode_group_killed_heals_with_no_person(
        stack: auto.Stack, sim: SimCluster, project: Project, tmp_path: Path) -> None:
    log = tmp_path / "reconcile.jsonl"
    watcher = subprocess.Popen(
        [str(REPO / "scripts" / "kimipd"), "-s", STACK, "--cwd", str(project.directory),
         "reconcile", "--watch", "--interval", "5", "--grace-seconds", "0",
         "--human-window-minutes", "0", "--log", str(log), "--state-file",
         str(tmp_path / "reconcile.json")],
        env=os.environ | project.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with StreamingLoad() as load:
            time.sleep(3)
            for group, (node, _) in DECODE_RANK0.items():
                assert sim.docker(node, "kill", "--signal", "KILL",
                                  f"kimipd-{group}-r0").returncode == 0
            killed = time.monotonic()
            # Serving again: a request sent now is answered whole.
            back = wait_for(lambda: any(not load.failed(since=time.monotonic() - 2) and
                                        r[0] > killed + 1 for r in load.results[-5:]) and
                            all(group_url(g) in urls for g in DECODE_RANK0
                                for urls in healthy_in_slots().values()),
                            420, "both decode groups healthy in both slots again", every=1)
            time.sleep(3)
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(300)
    failed_after = [r for r in load.failed() if r[0] > killed + back]
    print(load.summary("every decode group killed") + f"; serving again {back:.1f}s after the "
          f"kill, {len(load.failed(since=killed))} failed after the kill")
    decisions = [line.get("decision") for line in lines if "decision" in line]
    assert "healed" in decisions, decisions
    assert "heal-failed" not in decisions, lines
    assert not failed_after, failed_after
    # One group load (3 s on the sim) plus 60 s, plus one watch interval to see it.
    assert back < 3 + 60 + 5 + 60, f"serving again only after {back:.0f}s"


def test_a_lost_node_goes_out_without_a_connection_and_comes_back_failing_nothing(
        stack: auto.Stack, sim: SimCluster, project: Project) -> None:
    set_link(LOST, up=False)
    try:
        # The router's checks see decode-b's rank 0 gone before the load starts: what fails
        # at the cut is what was open there (test above), not what this measures.
        wait_for(lambda: all(group_url("decode-b") not in urls
                             for urls in healthy_in_slots().values()), 60,
                 "decode-b unhealthy in both slots")
        project.write_stack(STACK, lost_values(sim, out=LOST))
        started = time.monotonic()
        with StreamingLoad() as load:
            time.sleep(2)
            out = kimipd(project, STACK, "up", "--", "--yes", "--skip-preview", timeout=900)
            time.sleep(2)
        took = time.monotonic() - started
        print(load.summary("node taken out, its link down") + f"; the up took {took:.0f}s")
        assert out.returncode == 0, out.stderr[-3000:]
        assert "dropped from the state, none contacted" in out.stderr
        assert not load.failed(), load.summary("node out")
        export = stack.export_stack().deployment or {}
        on_lost = [r["urn"] for r in export.get("resources", [])
                   if (r.get("inputs") or {}).get("connection", {}).get("host") == LOST
                   or LOST in str((r.get("inputs") or {}).get("host", ""))]
        assert on_lost == [], on_lost
        assert all(group_url("decode-a") in urls for urls in healthy_in_slots().values())
        assert "decode-b" not in stack.outputs()["groups"].value
        # A no-op now: nothing of the node is left to exclude, nothing else changes.
        again = kimipd(project, STACK, "preview", timeout=600)
        assert again.returncode == 0 and "the state holds nothing of them" in again.stderr
    finally:
        set_link(LOST, up=True)
    # Back: the node as after a repair (no old container), and the edit undone.
    sim.remove_kimipd_containers([LOST])
    project.write_stack(STACK, lost_values(sim))
    with StreamingLoad() as load:
        time.sleep(2)
        back = kimipd(project, STACK, "up", "--", "--yes", "--skip-preview", timeout=900)
        time.sleep(2)
    print(load.summary("node put back"))
    assert back.returncode == 0, back.stderr[-3000:]
    assert not load.failed(), load.summary("node put back")
    assert all(group_url(g) in urls for g in DECODE_RANK0
               for urls in healthy_in_slots().values())
    resources = stack.export_stack().deployment["resources"]
    again_on_node = {r["urn"].rsplit("::", 1)[-1] for r in resources
                     if (r.get("inputs") or {}).get("connection", {}).get("host") == LOST}
    assert {"node-10-231-60-7-preflight", "node-10-231-60-7-nftables"} <= again_on_node, \
        sorted(again_on_node)
