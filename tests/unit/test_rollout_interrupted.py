"""A change of contract stopped at every step of its rollout (a Ctrl-C, a killed `pulumi`, a
failed gate: the steps after it do not run), raced at each step by `kimipd reconcile`'s
re-registration (each slot's restore), then taken forward by the next `up` of the same config,
or back by the next `up` of the old one. Against the in-memory routers and door of
test_serving_contract: after every step, no router holds a prefill and a decode of two
contracts, a slot serves, and no drain waits for a peer that never comes."""

from __future__ import annotations

import pytest

from tests.conftest import asset_script
from tests.unit.test_serving_contract import GROUPS, Node

# The order the engine runs the halves in (each decode waits for its half of the prefill
# groups, components/cluster.paired_prefill): a group's drain (its containers then go), then
# its admission under the new contract.
ORDER = ["prefill-b", "decode-b", "prefill-a", "decode-a"]
STEPS = [(action, group) for group in ORDER for action in ("drain", "admit")]


class Rollout:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.drained: set[str] = set()

    def step(self, action: str, group: str, contract: str) -> None:
        if action == "drain":
            self.node.drain(group)
            self.drained.add(group)
        else:
            self.node.admit(group, contract)
            self.drained.discard(group)
        self.settled()

    def reconcile(self) -> None:
        """Every slot's restore, as reconcile's re-registration runs it: twice (a --watch)."""
        for _ in range(2):
            for router in self.node.routers:
                self.node.members.register_missing(router, self.node.state, quiet=True)
        self.settled()

    def settled(self) -> None:
        self.node.check()
        assert self.node.serving(), f"no slot serves: {self.node.holds()}"

    def up(self, contract: str) -> None:
        """The next `up` of CONTRACT's config: each group not running it, or drained and not yet
        admitted, is drained (again) and admitted, in the engine's order; reconcile races it
        after every step."""
        # The engine runs the halves' groups side by side: one drained for its replacement
        # (it holds its mode's lease) is admitted before the other drain of its mode goes.
        for group in sorted(ORDER, key=lambda g: (g not in self.drained, ORDER.index(g))):
            if self.node.contract.get(group) != contract or group in self.drained:
                self.step("drain", group, contract)
                self.reconcile()
                self.step("admit", group, contract)
                self.reconcile()
        assert self.node.holds() == [{group: contract for group in GROUPS}] * 2
        assert sorted(self.node.serving()) == ["slot-a", "slot-b"]
        assert self.node.state.phase() == "steady"


@pytest.mark.parametrize("stopped_after", range(len(STEPS) + 1),
                         ids=[f"after-{i}-steps" for i in range(len(STEPS) + 1)])
@pytest.mark.parametrize("then", ["forward", "back"])
def test_a_rollout_stopped_at_any_step_never_mixes_and_goes_either_way(
        tmp_path, monkeypatch: pytest.MonkeyPatch, stopped_after: int, then: str) -> None:
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.want_all("c0")
    rollout = Rollout(node)
    for action, group in STEPS[:stopped_after]:
        rollout.step(action, group, "c1")
        rollout.reconcile()
    rollout.reconcile()
    rollout.up("c1" if then == "forward" else "c0")


def test_the_reported_interruption_is_not_completed_with_the_old_contract(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The case seen on the sim: slot a out at the door holding the new prefill alone, decode-b
    drained for its replacement; reconcile's restore of slot a added prefill-a and decode-a of
    the old contract beside it."""
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.want_all("c0")
    node.drain("prefill-b")
    node.admit("prefill-b", "c1")
    node.drain("decode-b")
    before = node.holds()
    for router in node.routers:
        node.members.register_missing(router, node.state, quiet=True)
    assert node.holds() == before == [{"prefill-b": "c1"},
                                      {"prefill-a": "c0", "decode-a": "c0"}]
    assert node.serving() == ["slot-b"]
    assert node.state.phase() == "converting"
    # Recorded as admitted: the config's contract and what /server_info says it resolved to.
    assert node.state.record()["slots"]["slot-a"] == {"contract": "c1.r0", "converting": True}


def test_a_slot_found_holding_two_contracts_keeps_its_own(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A router mixed by something else (an earlier version's restore): its restore removes the
    groups that are not of the slot's contract."""
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.want_all("c0")
    node.drain("prefill-b")
    node.admit("prefill-b", "c1")
    slot_b = node.routers[1]
    slot_b.call("POST", "/workers", {"url": node.urls["prefill-b"], "worker_type": "prefill"})
    node.members.register_missing(slot_b, node.state, quiet=True)
    node.check()
    assert node.holds()[1] == {"prefill-a": "c0", "decode-a": "c0", "decode-b": "c0"}


def test_an_operators_stop_ends_a_waiting_drain_at_once(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prefill-a waits for a peer in slot b (the new half is not whole yet); a stop asked
    after it started ends it with the phase, instead of its wait's bound."""
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.want_all("c0")
    node.drain("prefill-b")
    node.admit("prefill-b", "c1")
    stopper = node.members.State(node.state.directory)
    real_sleep = node.members.time.sleep

    def stop_soon(seconds: float) -> None:
        with stopper.locked():
            stopper.request_stop()
        real_sleep(seconds)

    monkeypatch.setattr(node.members.time, "sleep", stop_soon)
    node.members.watch_for_stop(node.state)
    with pytest.raises(SystemExit, match="stopped by the operator while waiting: no other "
                                         "prefill group.*phase converting"):
        node.drain("prefill-a", timeout=60)
    # The next update's scripts start after the stop: it does not end them.
    monkeypatch.setattr(node.members.time, "sleep", real_sleep)
    later = node.members.State(node.state.directory)
    assert not later.stopped()
    node.members.watch_for_stop(later)


def test_groups_of_one_config_that_resolve_apart_are_never_paired(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode-b's /server_info resolves to other KV settings than the rest under the same
    config (a backend that snaps its page size, an "auto" dtype resolved otherwise): admitted,
    it is a contract of its own, so no slot holds it beside a prefill of the others."""
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.resolved[node.urls["decode-b"]] = "r1"
    node.want_all("c0")
    for held in node.holds():
        assert "decode-b" not in held or "prefill-a" not in held and "prefill-b" not in held, \
            node.holds()
    assert node.serving(), node.holds()
    assert node.state.contract("decode-b") == "c0.r1" != node.state.contract("decode-a")



def test_a_stack_created_where_another_was_stopped_midway_inherits_nothing(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another stack on the same router port, stopped mid-change (a slot out at the door, a
    lease held) and then removed without its destroy: each group and slot of the new stack
    is new to the record, so its `want` drops what the record held of that name; `unwant`
    drops it too."""
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.want_all("c0")
    node.drain("prefill-b")
    node.admit("prefill-b", "c1")
    node.drain("decode-b")
    for marker in (tmp_path / "state" / "desired").iterdir():
        marker.unlink()  # the containers and markers gone, the record left
    assert node.state.record()["leases"] and node.state.converting("slot-a")
    slots = asset_script("door-slots.py")
    for slot in ("a", "b"):
        monkeypatch.setattr("sys.argv", ["door-slots.py", "want", "--slot", slot,
                                         "--state-dir", node.state.directory])
        assert slots.main() == 0
    for group, mode in GROUPS.items():
        monkeypatch.setattr("sys.argv", ["router-members.py", "want", "--group", group,
                                         "--mode", mode, "--url", node.urls[group],
                                         "--state-dir", node.state.directory])
        assert node.members.main() == 0
    record = node.state.record()
    assert (record["slots"], record["leases"], record["groups"]) == ({}, {}, {}), record
    monkeypatch.setattr("sys.argv", ["router-members.py", "unwant", "--group", "prefill-a",
                                     "--mode", "prefill", "--url", node.urls["prefill-a"],
                                     "--state-dir", node.state.directory])
    with node.state.locked():
        node.state.record_contract("prefill-a", "c2")
    assert node.members.main() == 0
    assert "prefill-a" not in node.state.record()["groups"]
