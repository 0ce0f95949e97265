"""`kimipd reconcile` on a stack with the door (tests/ops/door_fakes.py, the status as `kimipd
status` takes it): a dead slot is a unit of its own, healed while the other serves; a dead door
is one too; the routers' view is asked of any slot that answers."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.config import VerificationSpec
from ops.heal_policy import MESSAGE_PREFIX, SERVING, WAITING, Limits, Memory, assess, breakages
from ops.reconcile import Reconciler, Settings
from ops.remote import RemoteError
from ops.stack import Access, Stack
from ops.topology import Topology
from tests.ops.door_fakes import (KEY, OTHER_DOOR, OTHER_DOOR_NODE, OTHER_KEEPALIVED,
                                  ROUTER_NODE, VIRTUAL_IP, DoorStack)
from tests.ops.test_reconcile import Engine
from tests.unit.test_heal_policy import report, row

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def door(tmp_path: Path) -> Iterator[DoorStack]:
    started = DoorStack(tmp_path)
    yield started
    started.stop()


class Harness:
    def __init__(self, tmp_path: Path, door: DoorStack) -> None:
        self.now = 1_000_000.0
        self.engine = Engine()
        self.log = io.StringIO()
        self.settings = Settings(stack="door", project_dir=tmp_path, limits=Limits(
            grace_seconds=10, max_heals_per_hour=2), dry_run=False,
            state_file=tmp_path / "state.json", log=self.log, probe_timeout=3.0)
        stack = Stack(Topology.from_outputs("door", door.outputs()), Access(None, {}),
                      VerificationSpec(), router_api_key=KEY, router_kind="rust")
        # A heal's update replaces what it names: the harness's fakes come back as new ones.
        self.engine.fixes = lambda: [door.replace(role) for role, container
                                     in door.containers.items() if container.exit_code]
        self.reconciler = Reconciler(self.settings, lambda: stack,
                                     lambda access: door.nodes(),
                                     engine_factory=lambda: self.engine, clock=lambda: self.now)

    def run(self, advance: float = 0.0):
        self.now += advance
        return self.reconciler.run_pass()

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log.getvalue().splitlines()]


def test_a_dead_slot_is_healed_alone_while_the_other_serves(tmp_path, door: DoorStack) -> None:
    h = Harness(tmp_path, door)
    first = h.run()
    assert first.kind == "healthy", first
    assert h.lines()[-1]["routerSees"] == {url: "healthy" for url in
                                           (door.groups["prefill"].url, door.groups["decode"].url)}
    assert h.lines()[-1]["routerSeesSlot"] == "a"
    door.kill_slot("a")
    grace = h.run(1)
    assert (grace.kind, grace.exit_code, grace.units) == ("grace", WAITING, ("router-a",))
    # slot a does not answer: the routers' view comes from b
    assert h.lines()[-1]["routerSeesSlot"] == "b" and len(h.lines()[-1]["routerSees"]) == 2
    healed = h.run(10)
    assert (healed.kind, healed.exit_code, healed.units) == ("healed", SERVING, ("router-a",))
    assert h.engine.heals == [f"{MESSAGE_PREFIX} heal router-a (kimipd-router-a on 127.0.1.4: "
                              "exited (exit 137))"]


def test_both_slots_dead_are_two_units_and_the_door_is_not_one(tmp_path,
                                                               door: DoorStack) -> None:
    """The door's own liveness (its exporter's monitor-uri) answers while no slot does: a heal
    of the slots does not count against the door's limit."""
    h = Harness(tmp_path, door)
    door.kill_slot("a")
    door.kill_slot("b")
    assert h.run().units == ("router-a", "router-b")
    assert "slot a: connection refused; slot b: connection refused" in (
        h.lines()[-1]["routerSees"]["error"])
    assert "routerSeesSlot" not in h.lines()[-1]


def test_a_dead_door_is_a_unit(tmp_path, door: DoorStack) -> None:
    h = Harness(tmp_path, door)
    door.kill("door")
    door.exporter.stop()
    door.door.stop()
    decision = h.run()
    assert (decision.kind, decision.units) == ("grace", ("door",))
    assert decision.details["problems"]["door"][0] == (
        "kimipd-door on 127.0.1.4: exited (exit 137)")


def test_units_of_a_door_stack() -> None:
    found = breakages(report(row("door"), row("router-a", "exited", ok=False), row("router-b"),
                             row("decode-r0", group="decode")))
    assert list(found) == ["router-a"]
    memory = Memory()
    limits = Limits(grace_seconds=60)
    assert assess(found, memory, limits, 0.0, serving=True).kind == "grace"
    decision = assess(found, memory, limits, 61.0, serving=True)
    assert (decision.kind, decision.units) == ("heal", ("router-a",))
    both = breakages(report(row("door", "exited", ok=False), row("router-a", ok=False),
                            row("router-b")))
    assert sorted(both) == ["door", "router-a"]


# -- the door on two nodes: each door and each keepalived is a unit of its own -------------------


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[DoorStack]:
    started = DoorStack(tmp_path, two_nodes=True)
    yield started
    started.stop()


def test_a_dead_keepalived_on_either_door_node_is_a_unit_healed_alone(
        tmp_path, two_nodes: DoorStack) -> None:
    """The address stays where it is (nothing fails), but cannot move: reconcile puts the
    keepalived back, and only it (a new keepalived starts as BACKUP: nopreempt)."""
    h = Harness(tmp_path, two_nodes)
    assert h.run().kind == "healthy"
    two_nodes.kill(OTHER_KEEPALIVED)
    grace = h.run(1)
    assert (grace.kind, grace.exit_code, grace.units) == ("grace", WAITING, (OTHER_KEEPALIVED,))
    assert grace.details["problems"][OTHER_KEEPALIVED] == [
        f"kimipd-keepalived on {OTHER_DOOR_NODE}: exited (exit 137)"]
    healed = h.run(10)
    assert (healed.kind, healed.units) == ("healed", (OTHER_KEEPALIVED,))
    assert h.engine.heals == [f"{MESSAGE_PREFIX} heal {OTHER_KEEPALIVED} (kimipd-keepalived on "
                              f"{OTHER_DOOR_NODE}: exited (exit 137))"]


def test_a_dead_keepalived_on_the_router_node_and_a_dead_door_on_the_other(
        tmp_path, two_nodes: DoorStack) -> None:
    h = Harness(tmp_path, two_nodes)
    two_nodes.kill("keepalived")
    two_nodes.kill(OTHER_DOOR)
    two_nodes.other_exporter.stop()
    decision = h.run()
    assert (decision.kind, decision.units) == ("grace", (OTHER_DOOR, "keepalived"))
    assert decision.details["problems"][OTHER_DOOR][0] == (
        f"kimipd-door on {OTHER_DOOR_NODE}: exited (exit 137)")


def test_each_pass_exports_who_holds_the_virtual_ip(tmp_path, two_nodes: DoorStack) -> None:
    """For KimipdVirtualIpSplitBrain, KimipdVirtualIpNoHolder and KimipdKeepalivedDown
    (observability/rules.py): nothing else exports them."""
    h = Harness(tmp_path, two_nodes)
    h.run()
    registry = h.reconciler.metrics.registry

    def held(node: str) -> float | None:
        return registry.get_sample_value("kimipd_virtual_ip_held", {
            "stack": "door", "node": node, "address": VIRTUAL_IP})

    def state(node: str, name: str) -> float | None:
        return registry.get_sample_value("kimipd_keepalived_state",
                                         {"stack": "door", "node": node, "state": name})

    assert (held(ROUTER_NODE), held(OTHER_DOOR_NODE)) == (1.0, 0.0)
    assert (state(ROUTER_NODE, "MASTER"), state(OTHER_DOOR_NODE, "BACKUP")) == (1.0, 1.0)
    two_nodes.hold(ROUTER_NODE, OTHER_DOOR_NODE)
    two_nodes.kill(OTHER_KEEPALIVED)
    h.run(1)
    assert (held(ROUTER_NODE), held(OTHER_DOOR_NODE)) == (1.0, 1.0)
    assert state(OTHER_DOOR_NODE, "absent") == 1.0 and state(OTHER_DOOR_NODE, "BACKUP") is None


def test_a_slot_that_lacks_a_serving_group_gets_it_back_from_its_restore(
        tmp_path, door: DoorStack) -> None:
    door.slots["b"].members["decode"] = (False, None, 0)
    h = Harness(tmp_path, door)
    decision = h.run()
    assert (decision.kind, decision.units, decision.exit_code) == \
        ("re-registered", ("router-b",), SERVING), decision
    assert "router-b lacks decode" in decision.message
    assert door.slots["b"].members["decode"][0], "the restore did not run"
    assert h.engine.heals == [], "no refresh and up: nothing drifted"
    assert h.run().kind == "healthy"


def record(door: DoorStack, phase: str, slots: dict[str, dict]) -> None:
    """The rollout's record on router.node as the node scripts leave it."""
    (door.state_dir / "rollout.json").write_text(json.dumps({
        "version": 1, "phase": phase, "target": "c1", "groups": {"prefill": "c1"},
        "slots": slots, "leases": {"decode": ["decode", 1.0]}, "stop": None,
        "step": "router-members admit prefill", "updated": 1.0}))


def test_a_slot_mid_change_of_contract_is_not_completed_by_reconcile(
        tmp_path, door: DoorStack) -> None:
    """Slot a out at the door taking the new contract's prefill alone (an `up` stopped there):
    its lacking groups are the other contract's, so reconcile waits and runs no restore; once
    the record is steady again, a lacking group is registered as before."""
    door.slots["a"].members["decode"] = (False, None, 0)
    record(door, "converting", {"slot-a": {"contract": "c1", "converting": True},
                                "slot-b": {"contract": "c0", "converting": False}})
    h = Harness(tmp_path, door)
    decision = h.run()
    assert (decision.kind, decision.units, decision.exit_code) == \
        ("rollout-under-way", ("router-a",), WAITING), decision
    assert "slot-a out at the door, taking c1" in decision.message
    assert "`scripts/kimipd up` takes it forward" in decision.message
    assert not door.slots["a"].members["decode"][0], "the restore ran mid-rollout"
    record(door, "steady", {"slot-a": {"contract": "c1", "converting": False},
                            "slot-b": {"contract": "c1", "converting": False}})
    assert h.run().kind == "re-registered"
    assert door.slots["a"].members["decode"][0]


def test_an_unreadable_record_registers_nothing(tmp_path, door: DoorStack) -> None:
    door.slots["b"].members["decode"] = (False, None, 0)
    (door.state_dir / "rollout.json").write_text("{half a record")
    decision = Harness(tmp_path, door).run()
    assert (decision.kind, decision.exit_code) == ("rollout-unknown", WAITING), decision
    assert "is not a rollout record" in decision.message
    assert not door.slots["b"].members["decode"][0]


def test_a_record_the_pass_read_too_late_is_read_again_before_deciding(
        tmp_path, door: DoorStack) -> None:
    """The pass's probe of the record timed out (a loaded router.node answers SSH late): read
    again, with a longer bound, before the slot's missing group is registered or left."""
    door.slots["b"].members["decode"] = (False, None, 0)
    record(door, "steady", {"slot-a": {"contract": "c1", "converting": False},
                            "slot-b": {"contract": "c1", "converting": False}})
    h = Harness(tmp_path, door)
    reads = []

    class FirstRecordReadTimesOut:
        def __init__(self) -> None:
            self.inner = door.nodes()

        def run(self, node, command, timeout, stdin=None, on_stdout=None):
            if "rollout.json" in command:
                reads.append(timeout)
                if len(reads) == 1:
                    raise RemoteError(f"ssh {node}: `cat ...` did not finish within {timeout:g}s")
            return self.inner.run(node, command, timeout, stdin, on_stdout)

        def close(self) -> None:
            self.inner.close()

    h.reconciler.transport_factory = lambda access: FirstRecordReadTimesOut()
    decision = h.run()
    assert decision.kind == "re-registered", decision
    assert reads == [3.0, 30.0]
    assert door.slots["b"].members["decode"][0]


def test_a_missing_group_waits_for_an_update_and_a_dry_run_changes_nothing(
        tmp_path, door: DoorStack) -> None:
    door.slots["a"].members["prefill"] = (False, None, 0)
    h = Harness(tmp_path, door)
    h.engine.locked = ["ops@console pid 4242"]
    decision = h.run()
    assert (decision.kind, decision.units, decision.exit_code) == \
        ("locked", ("router-a",), WAITING), decision
    assert not door.slots["a"].members["prefill"][0]
    h.engine.locked = []
    h.reconciler.settings = dataclasses.replace(h.settings, dry_run=True)
    decision = h.run()
    assert (decision.kind, decision.exit_code) == ("would-register", WAITING), decision
    assert not door.slots["a"].members["prefill"][0], "a dry run registered the group"
