"""`kimipd reconcile`'s decisions (ops/heal_policy.py): grace, the hourly limit, back-off, hands
off during a person's update and over changes no one applied; plain functions, no engine."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from ops.heal_policy import (MESSAGE_PREFIX, REFUSED, SERVING, WAITING, Breakage, Limits,
                             Memory, assess, breakages, engine_checks, finish_heal,
                             forget_heal, start_heal)
from ops.probe import HttpAnswer
from ops.topology import ContainerRef
from ops.stack_engine_types import UpdateEntry
from ops.verdict import Docker, LoadingUnit, Report, Row

LIMITS = Limits(grace_seconds=60, max_heals_per_hour=2, backoff_seconds=60,
                backoff_max_seconds=200, human_window_seconds=900)
DEAD = {"decode-b": Breakage(("kimipd-decode-b-r1 on 10.0.0.8: exited (137)",))}
NOW = 1_000_000.0


def row(role: str, state: str = "running", ok: bool = True, group: str | None = None,
        generation: str | None = None) -> Row:
    ref = ContainerRef(role=role, node="10.0.0.1", name=f"kimipd-{role}",
                       health_url="http://10.0.0.1:30000/health", group=group)
    health = HttpAnswer(ref.health_url, "direct", 200 if ok else None,
                        error=None if ok else "connection refused")
    return Row(ref, Docker(state, 137 if state == "exited" else None, generation=generation),
               health)


def report(*rows: Row) -> Report:
    return Report("s", datetime.now(timezone.utc), True, list(rows), None, 0, "serving")


def test_breakages_are_per_group_and_ignore_a_pending_generation() -> None:
    found = breakages(report(
        row("mooncake-master"),
        row("decode-b-r0", group="decode-b", generation="0"),
        row("decode-b-r1", state="exited", ok=False, group="decode-b"),
        row("prefill-a-r0", ok=False, group="prefill-a"),
        row("router", state="absent", ok=False),
        row("decode-a-r0", group="decode-a", generation="7"),  # the stack has another: an up
    ))
    assert sorted(found) == ["decode-b", "prefill-a", "router"]
    assert found["decode-b"].problems == ("kimipd-decode-b-r1 on 10.0.0.1: exited (exit 137)",)
    assert "health" in found["prefill-a"].problems[0]
    assert "container absent" in found["router"].problems[0]


def test_an_unknown_docker_state_is_an_unreachable_node() -> None:
    unknown = row("decode-b-r1", state="unknown", group="decode-b")
    unknown.docker.error = "ssh: connect timed out"
    found = breakages(report(unknown))
    assert not found["decode-b"].reachable
    memory = Memory()
    assess(found, memory, LIMITS, NOW, serving=True)
    decision = assess(found, memory, LIMITS, NOW + 61, serving=True)
    assert (decision.kind, decision.exit_code) == ("unreachable", REFUSED)


def test_a_unit_is_healed_only_once_it_stayed_broken_past_the_grace() -> None:
    memory = Memory()
    first = assess(DEAD, memory, LIMITS, NOW, serving=True)
    assert (first.kind, first.exit_code, first.units) == ("grace", WAITING, ("decode-b",))
    assert assess(DEAD, memory, LIMITS, NOW + 59, serving=True).kind == "grace"
    assert assess(DEAD, memory, LIMITS, NOW + 60, serving=True).kind == "heal"
    # Back on its own before a heal: the grace starts again at the next death.
    healthy = assess({}, memory, LIMITS, NOW + 61, serving=True)
    assert (healthy.kind, healthy.exit_code, memory.last_healthy) == ("healthy", SERVING, NOW + 61)
    assert assess(DEAD, memory, LIMITS, NOW + 62, serving=True).kind == "grace"


def test_a_group_loading_within_its_bound_is_waited_for_and_is_not_healthy() -> None:
    memory = Memory()
    loading = [LoadingUnit("decode-b", 20.4, 45.0, "rank 0's port refuses connections")]
    decision = assess({}, memory, LIMITS, NOW, serving=True, loading=loading)
    assert (decision.kind, decision.exit_code, decision.units) == ("loading", WAITING,
                                                                   ("decode-b",))
    assert "decode-b loading: up 20s of its 45s load bound" in decision.message
    assert decision.details["loading"][0]["boundSeconds"] == 45.0
    assert memory.last_healthy is None
    # Another unit broken meanwhile is judged as ever: the loading one is no reason to wait.
    assert assess(DEAD, memory, LIMITS, NOW, serving=True, loading=loading).kind == "grace"


def test_nothing_is_healed_when_the_stack_is_meant_to_be_down() -> None:
    decision = assess(DEAD, Memory(), LIMITS, NOW, serving=False)
    assert (decision.kind, decision.exit_code) == ("not-serving", SERVING)


def test_the_hourly_limit_refuses_and_says_until_when() -> None:
    memory = Memory()
    for started in (NOW - 3000, NOW - 100):
        start_heal(memory, ["decode-b"], started)
        finish_heal(memory, ["decode-b"], started, True, LIMITS, "f")
    memory.unit("decode-b").broken_since = NOW - 120
    decision = assess(DEAD, memory, LIMITS, NOW, serving=True)
    assert (decision.kind, decision.exit_code) == ("limited", REFUSED)
    assert "decode-b was healed 2 times in the last hour (limit 2" in decision.message
    again = datetime.fromtimestamp(NOW - 3000 + 3600, timezone.utc).strftime("%H:%M:%S")
    assert again in decision.message and "kimipd logs --role decode-b" in decision.message
    # An hour after the older heal, one is left in the window: allowed again.
    assert assess(DEAD, memory, LIMITS, NOW + 601, serving=True).kind == "heal"


def test_failed_heals_back_off_exponentially_up_to_the_cap() -> None:
    memory = Memory()
    waits = []
    for attempt in range(3):
        started = NOW + 1000 * attempt
        start_heal(memory, ["decode-b"], started)
        finish_heal(memory, ["decode-b"], started, False, LIMITS, "config-1")
        waits.append(memory.unit("decode-b").retry_at - started)
        memory.unit("decode-b").heals.clear()  # keep the hourly limit out of it
    assert waits == [60, 120, 200]
    memory.unit("decode-b").broken_since = NOW
    decision = assess(DEAD, memory, LIMITS, NOW + 2100, serving=True)
    assert (decision.kind, decision.exit_code) == ("backoff", REFUSED)
    assert "failed (3 in a row)" in decision.message
    assert assess(DEAD, memory, LIMITS, NOW + 2200, serving=True).kind == "heal"
    start_heal(memory, ["decode-b"], NOW + 2200)
    finish_heal(memory, ["decode-b"], NOW + 2200, True, LIMITS, "config-1")
    unit = memory.unit("decode-b")
    assert (unit.failures, unit.retry_at, unit.healed_total, unit.failed_total) == (0, None, 1, 3)


def test_a_heal_the_engine_never_started_does_not_count() -> None:
    memory = Memory()
    start_heal(memory, ["decode-b"], NOW)
    forget_heal(memory, ["decode-b"], NOW)
    assert memory.unit("decode-b").heals == []


def entry(message: str, ended: float, kind: str = "update") -> UpdateEntry:
    return UpdateEntry(kind=kind, message=message, started=ended - 30, ended=ended,
                       result="succeeded")


def heal_decision():
    memory = Memory()
    assess(DEAD, memory, LIMITS, NOW - 100, serving=True)
    decision = assess(DEAD, memory, LIMITS, NOW, serving=True)
    assert decision.kind == "heal"
    return decision, memory


def no_preview():
    raise AssertionError("the preview ran although an earlier check had decided")


def test_a_held_lock_waits_and_never_previews() -> None:
    heal, memory = heal_decision()
    decision = engine_checks(heal, ["ops@host pid 42 since 10:00"], [], no_preview, "f", memory,
                             LIMITS, NOW)
    assert (decision.kind, decision.exit_code) == ("locked", WAITING)
    assert "ops@host pid 42" in decision.message and "never cancelling" in decision.message


def test_a_persons_recent_update_holds_off_but_reconciles_own_do_not() -> None:
    heal, memory = heal_decision()
    history = [entry(MESSAGE_PREFIX + " heal decode-a", NOW - 10),
               entry("widen decode", NOW - 600)]
    decision = engine_checks(heal, [], history, no_preview, "f", memory, LIMITS, NOW)
    assert (decision.kind, decision.exit_code) == ("human-window", WAITING)
    assert "update ended 10.0 min ago" in decision.message and "widen decode" in decision.message
    later = engine_checks(heal, [], history, lambda: {}, "f", memory, LIMITS, NOW + 301)
    assert later.kind == "heal"


def test_changes_no_one_applied_are_refused_except_finishing_its_own_failed_heal() -> None:
    heal, memory = heal_decision()
    pending = {"replace": 2, "update": 1}
    decision = engine_checks(heal, [], [entry("old", NOW - 5000)], lambda: pending, "f1",
                             memory, LIMITS, NOW)
    assert (decision.kind, decision.exit_code) == ("pending-changes", REFUSED)
    assert "replace 2, update 1" in decision.message and "pulumi up" in decision.message
    # Our own heal failed half-way with this very config: finishing it is allowed...
    finish_heal(memory, ["decode-b"], NOW - 400, False, LIMITS, "f1")
    ours = [entry(MESSAGE_PREFIX + " heal decode-b", NOW - 300), entry("old", NOW - 5000)]
    assert engine_checks(heal, [], ours, lambda: pending, "f1", memory, LIMITS,
                         NOW).kind == "heal"
    # ... but not once someone changed the config since.
    assert engine_checks(heal, [], ours, lambda: pending, "f2", memory, LIMITS,
                         NOW).kind == "pending-changes"


@pytest.mark.parametrize("data", [{}, {"units": {"decode-b": {"heals": [1.0], "failures": 2}}}])
def test_memory_round_trips_through_json(data: dict) -> None:
    memory = Memory.from_json(data)
    assert Memory.from_json(memory.as_json()) == memory


def test_a_unit_that_runs_and_does_not_answer_is_hung_and_an_exited_one_is_not() -> None:
    paused = row("decode-a-r1", state="paused", group="decode-a")
    found = breakages(report(
        row("decode-a-r0", ok=False, group="decode-a"), paused,
        row("decode-b-r0", ok=False, group="decode-b"),
        row("decode-b-r1", state="exited", ok=False, group="decode-b"),
    ))
    assert found["decode-a"].hung == (("10.0.0.1", "kimipd-decode-a-r0"),
                                      ("10.0.0.1", "kimipd-decode-a-r1"))
    assert "kimipd-decode-a-r1 on 10.0.0.1: paused (running, not answering)" in \
        found["decode-a"].problems
    assert found["decode-b"].hung == ()  # an exited rank drifts: refresh and up replace it
