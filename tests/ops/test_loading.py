"""A group still loading is not hung (ops/verdict.py, loading_units): SGLang opens its HTTP port
once its model is loaded and answers 503 while it warms up; within its load bound such a group is
left alone by status and reconcile, past it it is hung, as is one that served and stopped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ops.heal_policy import breakages
from ops.probe import HttpAnswer
from ops.topology import ContainerRef
from ops.verdict import Docker, Report, Row, hung_units, loading_units

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
REFUSED = HttpAnswer("http://10.0.0.1:30000/health", "direct", error="connection refused")
WARMING = HttpAnswer("http://10.0.0.1:30000/health", "direct", 503,
                     body='{"status": "unhealthy", "reason": "warming up"}')
STALLED = HttpAnswer("http://10.0.0.1:30000/health", "direct", 503,
                     body='{"status": "unhealthy", "reason": "no output for 20s"}')
SILENT = HttpAnswer("http://10.0.0.1:30000/health", "direct", error="timed out")


def group(rank0: HttpAnswer, up_seconds: float, name: str = "decode-b") -> list[Row]:
    started = (NOW - timedelta(seconds=up_seconds)).isoformat()
    return [Row(ContainerRef(f"{name}-r{rank}", f"10.0.0.{rank + 1}", f"kimipd-{name}-r{rank}",
                             f"http://10.0.0.{rank + 1}:30000/health", name, rank),
                Docker("running", started_at=started), rank0 if rank == 0 else REFUSED)
            for rank in range(2)]


def test_a_group_refusing_or_warming_up_within_its_bound_is_loading_not_hung() -> None:
    for answer in (REFUSED, WARMING):
        rows = group(answer, 600)
        loading, overdue = loading_units(rows, {"decode-b": 1800}, NOW)
        assert [unit.unit for unit in loading] == ["decode-b"] and overdue == {}
        assert loading[0].as_json()["seconds"] == 600
        assert hung_units(rows, {"decode-b"}) == {}
        report = Report("s", NOW, True, rows, None, 1, "degraded", loading=loading)
        assert breakages(report) == {}, "a loading group counted as broken"


def test_past_its_bound_a_loading_group_is_hung_with_the_reason() -> None:
    rows = group(REFUSED, 1900)
    loading, overdue = loading_units(rows, {"decode-b": 1800}, NOW)
    assert loading == []
    assert "past its load bound 30m" in overdue["decode-b"]
    assert set(hung_units(rows)) == {"decode-b"}


def test_a_group_that_stalls_or_answers_nothing_is_never_loading() -> None:
    for answer in (STALLED, SILENT):
        loading, overdue = loading_units(group(answer, 60), {"decode-b": 1800}, NOW)
        assert loading == [] and overdue == {}, answer


def test_an_older_stack_without_a_bound_has_no_loading_group() -> None:
    assert loading_units(group(REFUSED, 60), {"decode-b": None}, NOW) == ([], {})


def test_each_group_has_a_state_and_its_evidence() -> None:
    """serving, busy (a 200 that took 12 s), loading, hung, down: what `kimipd status --json`
    says of each group (groupStates)."""
    from ops.verdict import HungUnit, group_states

    fast = HttpAnswer("http://10.0.0.1:30000/health", "direct", 200, seconds=0.2)
    slow = HttpAnswer("http://10.0.0.1:30000/health", "direct", 200, seconds=12.0)
    ok_peer = HttpAnswer("http://10.0.0.2:30000/health", "direct", 200, seconds=0.01)

    def rows(name: str, rank0: HttpAnswer, peer: HttpAnswer = ok_peer,
             state: str = "running") -> list[Row]:
        made = group(rank0, 60, name)
        made[0].health, made[1].health = rank0, peer
        made[1].docker = Docker(state, exit_code=None if state == "running" else 137,
                                started_at=made[1].docker.started_at)
        for row in made:
            row.problems = [] if row.health.ok and row.docker.state == "running" else ["x"]
        return made

    everything = (rows("a", fast) + rows("b", slow) + rows("c", REFUSED, REFUSED)
                  + rows("d", STALLED) + rows("e", fast, state="exited"))
    loading, _ = loading_units(everything, {name: 1800 for name in "abcde"}, NOW)
    hung = [HungUnit(unit, []) for unit in hung_units(everything, {u.unit for u in loading})]
    report = Report("s", NOW, True, everything, None, 1, "degraded", hung=hung, loading=loading)
    states = {name: state["state"] for name, state in group_states(report).items()}
    assert states == {"a": "serving", "b": "busy", "c": "loading", "d": "hung", "e": "down"}
    assert "200 in 12.0s" in group_states(report)["b"]["evidence"]
    assert report.as_json()["groupStates"]["c"]["state"] == "loading"
