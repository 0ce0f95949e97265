"""What `kimipd status` concludes from what its probes found, as plain data and pure functions:
each container's problems, the units that hang, the nodes lost, the report's shape. The probes
(ops/status.py `collect`) fill it; the table (ops/status_render.py) and the heal policy
(ops/heal_policy.py) read it and nothing of the probes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Iterable, Mapping
from typing import Any

from .door import DoorReport
from .rollout import Rollout
from .probe import HttpAnswer
from .topology import ContainerRef
from .virtual_ip import VirtualIpReport


@dataclass
class Docker:
    """What `docker inspect` said about one container (or why it could not say)."""

    state: str  # running, exited, ..., "absent", "unknown"
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    generation: str | None = None
    error: str | None = None


@dataclass
class Row:
    ref: ContainerRef
    docker: Docker
    health: HttpAnswer
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Report:
    stack: str
    checked_at: datetime
    serving: bool
    rows: list[Row]
    path: HttpAnswer | None
    exit_code: int
    verdict: str
    notes: list[str] = field(default_factory=list)
    # node -> "present", "missing" or why it could not be told; {} when the stack has none
    firewall: dict[str, str] = field(default_factory=dict)
    # The door and its slots; None for a stack without a door.
    door: DoorReport | None = None
    # Nodes whose SSH or docker engine did not answer, first in the report.
    lost: list[LostNode] = field(default_factory=list)
    # Who holds the door's virtual IP; None without one (a door on router.node alone).
    virtual_ip: VirtualIpReport | None = None
    # Units that run and do not serve (hung_units), first broken when (reconcile's state).
    hung: list[HungUnit] = field(default_factory=list)
    # The rollout's record on router.node (ops/rollout.py), or why it could not be read; None
    # without one (no door, MiniLB).
    rollout: Rollout | str | None = None
    # Groups that run and do not serve yet, within their load bound (loading_units).
    loading: list[LoadingUnit] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        document = {
            "stack": self.stack,
            "checkedAt": self.checked_at.isoformat(timespec="seconds"),
            "serving": self.serving,
            "verdict": self.verdict,
            "exitCode": self.exit_code,
            "containers": [{
                "role": row.ref.role,
                "group": row.ref.group,
                "rank": row.ref.rank,
                "node": row.ref.node,
                "container": row.ref.name,
                "state": row.docker.state,
                "exitCode": row.docker.exit_code,
                "startedAt": row.docker.started_at,
                "uptimeSeconds": uptime_seconds(row.docker, self.checked_at),
                "restartGeneration": row.docker.generation,
                "dockerError": row.docker.error,
                "health": row.health.as_json(),
                "ok": row.ok,
                "problems": row.problems,
            } for row in self.rows],
            "generate": self.path.as_json() if self.path else None,
            "firewall": self.firewall,
            "notes": self.notes,
        }
        if self.door is not None:
            document["door"] = self.door.as_json()
        if self.virtual_ip is not None:
            document["virtualIp"] = self.virtual_ip.as_json()
        document["lostNodes"] = [lost.as_json() for lost in self.lost]
        document["hungUnits"] = [hung.as_json() for hung in self.hung]
        document["loadingUnits"] = [unit.as_json() for unit in self.loading]
        document["groupStates"] = group_states(self)
        if self.rollout is not None:
            document["rollout"] = (self.rollout.as_json() if not isinstance(self.rollout, str)
                                   else {"error": self.rollout})
        return document


@dataclass
class HungUnit:
    """A unit (a group, or a role of its own) whose containers all run, or are paused, while
    one of them does not serve: a rank stuck in a collective, a wedged GPU. Distinct from an
    exited unit: refresh sees no drift, and reconcile replaces its containers."""

    unit: str
    containers: list[str]  # NAME@NODE
    # When reconcile first found the unit broken (its state file), None if no pass has.
    since: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "containers": self.containers,
                "since": (datetime.fromtimestamp(self.since, timezone.utc)
                          .isoformat(timespec="seconds") if self.since else None)}

    def line(self) -> str:
        since = (f" since {datetime.fromtimestamp(self.since, timezone.utc):%H:%M:%S} UTC"
                 if self.since else "")
        return (f"{self.unit} hung{since}: running, not answering ({', '.join(self.containers)});"
                " reconcile replaces its containers (docs/healing.md: a group hangs)")


@dataclass
class LoadingUnit:
    """A group whose containers all run while it does not serve yet, with the evidence that it
    is loading (SGLang opens its HTTP port once its model is loaded and answers 503 while it
    warms up), up for less than its load bound: left alone by reconcile, not hung. Past the
    bound it is hung (hung_units)."""

    unit: str
    seconds: float  # since its rank 0 started
    bound: float
    evidence: str

    def as_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "seconds": round(self.seconds), "boundSeconds": self.bound,
                "evidence": self.evidence}

    def line(self) -> str:
        return (f"{self.unit} loading for {duration(self.seconds)} of its "
                f"{duration(self.bound)} bound: {self.evidence}")


def rows_by_group(rows: list[Row]) -> dict[str, list[Row]]:
    """Each SGLang group's rows (its ranks), in the order given."""
    by_group: dict[str, list[Row]] = {}
    for row in rows:
        if row.ref.group is not None:
            by_group.setdefault(row.ref.group, []).append(row)
    return by_group


# A 200 from rank 0's /health slower than this: SGLang's check waits for the scheduler's next
# output, so a late answer is a group busy with long prefills, and healthy.
BUSY_HEALTH_SECONDS = 5.0


def group_states(report: Report) -> dict[str, dict[str, str]]:
    """Each group's state as SGLang judges it, with the evidence that decided it: `loading`
    (within its load bound, loading_units), `hung` (every container holding its process, not
    serving: hung_units), `down` (a container not running), `busy` (every rank answering, rank
    0's /health 200 but late), `serving`, else `degraded`."""
    by_group = rows_by_group(report.rows)
    loading = {unit.unit: unit for unit in report.loading}
    hung = {unit.unit for unit in report.hung}
    states = {}
    for group, members in sorted(by_group.items()):
        rank0 = next((row for row in members if row.ref.rank == 0), members[0])
        health = rank0.health
        took = f" in {health.seconds:.1f}s" if health.seconds is not None else ""
        problems = "; ".join(f"{row.ref.role}: {', '.join(row.problems)}"
                             for row in members if row.problems)
        if group in loading:
            state, evidence = "loading", loading[group].line()
        elif group in hung:
            state, evidence = "hung", f"every container holds its process; {problems}"
        elif any(row.docker.state != "running" for row in members):
            state, evidence = "down", problems
        elif all(row.health.ok for row in members) and (health.seconds or 0) > BUSY_HEALTH_SECONDS:
            state, evidence = "busy", (f"rank 0's /health 200{took}: its scheduler is slow to "
                                       "give an output (long prefills), not stuck")
        elif all(row.health.ok for row in members):
            state, evidence = "serving", f"rank 0's /health 200{took}"
        else:
            state, evidence = "degraded", problems
        states[group] = {"state": state, "evidence": evidence}
    return states


# What a loading SGLang's (and the stand-in's) /health 503 says; a hung one says "no output".
LOADING_SIGNS = ("loading", "warming up", "waiting for")


def loading_evidence(answer: HttpAnswer) -> str | None:
    """Why rank 0's health answer reads as a server still loading, or None."""
    if answer.status is None and answer.error == "connection refused":
        return "rank 0's port refuses connections (SGLang opens it once the model is loaded)"
    body = answer.body.lower()
    if answer.status == 503 and any(sign in body for sign in LOADING_SIGNS):
        return f"rank 0's /health 503: {answer.body.strip()[:120]}"
    return None


def loading_units(rows: list[Row], bounds: Mapping[str, float | None],
                  now: datetime) -> tuple[list[LoadingUnit], dict[str, str]]:
    """(the groups loading within their bound (BOUNDS: group -> loadBoundSeconds), the groups
    past it -> why they are hung): every container of the group running, rank 0 not serving with
    the evidence of a load (loading_evidence), rank 0 up for less than its bound."""
    by_group = rows_by_group(rows)
    loading, overdue = [], {}
    for group, members in sorted(by_group.items()):
        rank0 = next((row for row in members if row.ref.rank == 0), None)
        bound = bounds.get(group)
        if rank0 is None or bound is None or rank0.health.ok:
            continue
        if not all(row.docker.state == "running" for row in members):
            continue
        evidence = loading_evidence(rank0.health)
        up = uptime_seconds(rank0.docker, now)
        if evidence is None or up is None:
            continue
        if up < bound:
            loading.append(LoadingUnit(group, up, bound, evidence))
        else:
            overdue[group] = (f"not serving {duration(up)} after its start, past its load bound "
                              f"{duration(bound)} ({evidence})")
    return loading, overdue


@dataclass
class LostNode:
    """A node the probes could not reach: what failed, what runs there, since when."""

    node: str
    ssh: bool  # SSH answered (then the docker engine did not)
    error: str
    roles: list[str]
    # When reconcile first found it lost (its state file), None if no pass has.
    since: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "ssh": "answers" if self.ssh else "unreachable",
                "dockerEngine": "unreachable", "error": self.error, "runs": self.roles,
                "since": (datetime.fromtimestamp(self.since, timezone.utc)
                          .isoformat(timespec="seconds") if self.since else None)}

    def line(self) -> str:
        since = (f" since {datetime.fromtimestamp(self.since, timezone.utc):%H:%M:%S} UTC"
                 if self.since else "")
        what = ("the docker engine does not answer (SSH does)" if self.ssh
                else "SSH and the docker engine do not answer")
        return (f"node {self.node} lost{since}: {what}: {self.error}; runs "
                f"{', '.join(self.roles)}. Reconcile waits for it; one that will not come "
                "back: set its nodes[].out and `scripts/kimipd up` (docs/healing.md)")


# docker's states of a container that is there and holds its process: a hung unit's.
HELD_STATES = ("running", "paused")


def unit_of(row: Row) -> str:
    """A rank's group; anything else is its own unit by its role (mooncake-master, router,
    door, router-a, router-b; on two door nodes door-A-B-C-D, keepalived, keepalived-A-B-C-D)."""
    return row.ref.group or row.ref.role


def hung_units(rows: list[Row],
               loading: Iterable[str] = ()) -> dict[str, tuple[tuple[str, str], ...]]:
    """Unit -> (node, container) of each of its containers, for each unit whose containers all
    hold their process (running or paused) while one does not serve (paused, or its health
    failing): what refresh cannot see and an update must replace by name. A group LOADING
    within its bound (loading_units) is none."""
    by_unit: dict[str, list[Row]] = {}
    for row in rows:
        if unit_of(row) not in loading:
            by_unit.setdefault(unit_of(row), []).append(row)
    return {unit: tuple((row.ref.node, row.ref.name) for row in members)
            for unit, members in by_unit.items()
            if all(row.docker.state in HELD_STATES for row in members)
            and any(row.docker.state == "paused" or not row.health.ok for row in members)}


def note_hung_since(report: Report, since: dict[str, float | None]) -> None:
    for hung in report.hung:
        hung.since = since.get(hung.unit)


def lost_nodes(rows: list[Row]) -> list[LostNode]:
    found: dict[str, LostNode] = {}
    for row in rows:
        docker = row.docker
        if docker.state != "unknown":
            continue
        error = docker.error or "docker state unknown"
        lost = found.setdefault(row.ref.node, LostNode(
            row.ref.node, error.startswith("docker: "), error.removeprefix("docker: "), []))
        lost.roles.append(row.ref.role)
    return [found[node] for node in sorted(found)]


def note_lost_since(report: Report, since: dict[str, float]) -> None:
    for lost in report.lost:
        lost.since = since.get(lost.node)


_DOCKER_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$")


def _parse_time(value: str | None) -> datetime | None:
    """docker's RFC 3339 with nanoseconds (2026-11-29T20:17:01.123456789Z); None when unset."""
    if not value or value.startswith("0001-"):
        return None
    match = _DOCKER_TIME.match(value)
    if not match:
        return None
    seconds, fraction, zone = match.groups()
    zone = "+00:00" if zone in (None, "Z") else zone
    return datetime.fromisoformat(seconds + (fraction or "")[:7] + zone)


def uptime_seconds(docker: Docker, now: datetime) -> float | None:
    started = _parse_time(docker.started_at)
    if docker.state != "running" or started is None:
        return None
    return max(0.0, (now - started).total_seconds())


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def problems(row: Row, expected_generation: int | None) -> list[str]:
    problems = []
    docker = row.docker
    if docker.state == "unknown":
        problems.append(docker.error or "docker state unknown")
    elif docker.state == "absent":
        problems.append("container absent")
    elif docker.state == "paused":
        problems.append("paused (running, not answering)")
    elif docker.state != "running":
        problems.append(f"{docker.state} (exit {docker.exit_code})")
    if (docker.generation is not None and expected_generation is not None
            and docker.generation != str(expected_generation)):
        problems.append(f"generation {docker.generation}, stack has {expected_generation} "
                        "(pulumi up pending)")
    if not row.health.ok:
        problems.append(f"health {row.health.summary()}")
    return problems


def container_state(docker: Docker) -> str:
    if docker.state in ("exited", "dead"):
        return f"{docker.state} ({docker.exit_code})"
    return docker.state
