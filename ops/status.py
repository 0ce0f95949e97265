"""`kimipd status`: every container's docker state (over SSH) and health (its healthUrl), and one
1-token /generate through the router for the whole path. Probes run in parallel, each bounded
by its timeout: a dead node costs its own rows, never the table.

With the door (the `door` output): the door's port, each slot's readiness and state at the door
(HAProxy's runtime API, over SSH on the router's node), and where each group stands in each
slot (registered, healthy, load: the slot's GET /workers). With the door on two nodes, each
door's view of both slots (each checks them on its own), which node holds the virtual IP and
each keepalived's state (ops/virtual_ip.py); two holders or none is down, and so is a holder
whose door sends to no slot."""

from __future__ import annotations

import json
import re
import shlex
import ssl
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from components.config.router_schema import DEFAULT_ROUTER_KIND
from components.render import GENERATION_LABEL, firewall_urn

from . import DEGRADED, DOWN, OK
from .door import DoorProbes, DoorReport
from .firewall_probe import firewall_on_node
from .probe import HttpAnswer, Prober, Tls, settled, tls_check
from .remote import CommandTimeout, RemoteError, Transport
from .stack import Stack
from .topology import ContainerRef, Topology
from .virtual_ip import VirtualIpProbes, VirtualIpReport

# The whole path: one token through the router (prefill, KV hand-off, decode).
PATH_PROBE_BODY = {"text": "ping", "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}


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


def hung_units(rows: list[Row]) -> dict[str, tuple[tuple[str, str], ...]]:
    """Unit -> (node, container) of each of its containers, for each unit whose containers all
    hold their process (running or paused) while one does not serve (paused, or its health
    failing): what refresh cannot see and an update must replace by name."""
    by_unit: dict[str, list[Row]] = {}
    for row in rows:
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


# A docker inspect that timed out on a node whose SSH answered is tried once more, this many
# times longer.
SLOW_ENGINE_FACTOR = 3


def inspect_node(transport: Transport, node: str, names: list[str],
                 timeout: float) -> dict[str, Docker]:
    """`docker inspect` of this node's containers in one command; a missing one is "absent"."""
    command = shlex.join(["docker", "inspect", "--type", "container", *names])
    try:
        try:
            result = transport.run(node, command, timeout=timeout)
        except CommandTimeout:
            # SSH answered: a docker engine busy starting containers can take longer than a
            # probe's timeout, so one more try with a longer one before calling it unknown.
            result = transport.run(node, command, timeout=SLOW_ENGINE_FACTOR * timeout)
    except CommandTimeout as error:
        return {name: Docker("unknown", error="docker: " + str(error)) for name in names}
    except RemoteError as error:
        return {name: Docker("unknown", error=str(error)) for name in names}
    try:
        # `docker inspect` always prints a JSON array, `[]` when it found none of them.
        found = json.loads(result.out)
    except json.JSONDecodeError:
        # An answer cut short (an SSH channel closed under load) says nothing of the containers:
        # read as "absent", a hung unit's heal once replaced nothing for containers that ran.
        return {name: Docker("unknown", error="docker inspect gave no JSON: "
                             + (result.err.strip() or result.out.strip() or "no output")[:200])
                for name in names}
    by_name = {item.get("Name", "").lstrip("/"): item for item in found}
    answers = {}
    for name in names:
        item = by_name.get(name)
        if item is None:
            if result.status != 0 and "No such" not in result.err:
                # docker itself failed (daemon down): not the same as a removed container
                answers[name] = Docker("unknown", error="docker: " + result.err.strip()[:200])
            else:
                answers[name] = Docker("absent")
            continue
        state = item.get("State") or {}
        labels = (item.get("Config") or {}).get("Labels") or {}
        answers[name] = Docker(state.get("Status", "unknown"), state.get("ExitCode"),
                               state.get("StartedAt"), state.get("FinishedAt"),
                               labels.get(GENERATION_LABEL))
    return answers


def _problems(row: Row, expected_generation: int | None) -> list[str]:
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


def door_tls(stack: Stack) -> Tls | None:
    """How the door's certificate is checked from here: against router.door.tls of the config
    when it is at hand (the CA is not among the outputs), else not at all. None: no TLS door."""
    door = stack.topology.door
    if door is None or not door.tls:
        return None
    config = stack.door_tls
    try:
        return tls_check(config.ca_certificate if config else None,
                         config.certificate if config else None)
    except ssl.SSLError as error:
        unverified = tls_check(None, None)
        return Tls(unverified.context, f"not verified (router.door.tls does not load: {error})")


def container_state(docker: Docker) -> str:
    if docker.state in ("exited", "dead"):
        return f"{docker.state} ({docker.exit_code})"
    return docker.state


def collect(topology: Topology, transport: Transport, prober: Prober, timeout: float,
            generate_timeout: float, api_key: str | None = None,
            router_kind: str = DEFAULT_ROUTER_KIND) -> Report:
    """API_KEY: the rust router's (the routerApiKey secret), sent with the whole-path probe and,
    with the door, each slot's GET /workers. ROUTER_KIND (router.kind of the config): what the
    door asks a slot, and whether a slot has a worker API."""
    now = datetime.now(timezone.utc)
    if not topology.serving or not topology.containers:
        reason = ("serving is false: no container is meant to run" if not topology.serving
                  else "the stack has no `containers` output (never deployed?)")
        return Report(topology.stack, now, topology.serving, [], None, DOWN, "down", [reason])
    by_node: dict[str, list[str]] = {}
    for ref in topology.containers:
        by_node.setdefault(ref.node, []).append(ref.name)
    pool = ThreadPoolExecutor(max_workers=min(64, 2 * len(topology.containers) + 2),
                              thread_name_prefix="kimipd-probe")
    try:
        inspections: dict[str, Future] = {
            node: pool.submit(inspect_node, transport, node, names, timeout)
            for node, names in by_node.items()}
        health: dict[str, Future] = {
            ref.role: pool.submit(prober.get, ref.health_url, ref.node)
            for ref in topology.containers}
        tables: dict[str, Future] = {
            node: pool.submit(firewall_on_node, transport, node, topology.firewall_table, timeout)
            for node in topology.nodes} if topology.firewall_table else {}
        path: Future | None = None
        if topology.generate_url:
            router = topology.router
            node = (topology.door.node if topology.door else router.node if router
                    else topology.containers[-1].node)
            path = pool.submit(prober.request, "POST", topology.generate_url, node,
                               PATH_PROBE_BODY, generate_timeout, api_key)
        door = (DoorProbes(topology.door, topology.groups, transport, prober, timeout, api_key,
                           router_kind) if topology.door else None)
        door_futures = door.submit(pool) if door else []
        vip = (VirtualIpProbes(topology.door, transport, timeout)
               if topology.door is not None and topology.door.virtual_ip is not None else None)
        door_futures += vip.submit(pool) if vip else []
        # A probe is bounded by its timeout (direct, then over SSH: connect + command); this is
        # the backstop for one that is not.
        everything = [*inspections.values(), *health.values(), *tables.values(),
                      *([path] if path else []), *door_futures]
        wait(everything, timeout=max(3 * timeout, generate_timeout) + 10)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)

    rows = []
    for ref in topology.containers:
        dockers = settled(inspections[ref.node], {})
        docker = dockers.get(ref.name) or Docker("unknown", error="docker inspect timed out")
        answer = settled(health[ref.role], HttpAnswer(ref.health_url, "-", error="timed out"))
        row = Row(ref, docker, answer)
        row.problems = _problems(row, topology.restart_generation)
        rows.append(row)
    path_answer = (settled(path, HttpAnswer(topology.generate_url, "-", error="timed out"))
                   if path is not None and topology.generate_url else None)

    firewall = {node: settled(future, "unknown: timed out") for node, future in tables.items()}
    missing = [node for node, state in firewall.items() if state == "missing"]
    door_report = None
    containers = {row.ref.role: container_state(row.docker) for row in rows}
    if door is not None:
        verification = (prober.tls.verification if prober.tls is not None
                        else "verified against the system's trust store")
        door_report = door.report(containers, verification)
    vip_report = vip.report(containers) if vip is not None else None
    notes = []
    if path_answer is None:
        notes.append("no generateUrl output: the whole path was not probed")
    for node in missing:
        notes.append(
            f"firewall: table {topology.firewall_table} is missing on {node}, so any host "
            "reaches every port there; put it back: pulumi up --replace "
            f"'{firewall_urn(topology.stack, node)}'")
    unreachable = sorted({row.ref.node for row in rows if row.docker.state == "unknown"})
    nothing_answered = (len(unreachable) == len(by_node)
                        and not any(row.health.status is not None for row in rows)
                        and not (path_answer and path_answer.status is not None))
    if nothing_answered:
        exit_code, verdict = DOWN, "unreachable"
        notes.append("no node answered over SSH and no HTTP probe got an answer")
    elif vip_report is not None and vip_report.down is not None:
        exit_code, verdict = DOWN, "down"
        notes.append(vip_report.down)
    elif (door_report is not None and vip_report is not None and len(vip_report.holders) == 1
          and door_report.serving_at(vip_report.holders[0]) == []):
        exit_code, verdict = DOWN, "down"
        notes.append(f"no slot serves at the door on {vip_report.holders[0]}, which holds the "
                     "virtual IP: every request fails")
    elif door_report is not None and not (door_report.open and door_report.serving_slots):
        exit_code, verdict = DOWN, "down"
        notes.append("the door does not take connections: no request gets in" if not
                     door_report.open else "no slot serves at the door: every request fails")
    elif (all(row.ok for row in rows) and path_answer is not None and path_answer.ok
          and not missing and (door_report is None or door_report.ok)
          and (vip_report is None or vip_report.ok)):
        exit_code, verdict = OK, "serving"
    else:
        exit_code, verdict = DEGRADED, "degraded"
    hung = [HungUnit(unit, [f"{name}@{node}" for node, name in containers])
            for unit, containers in sorted(hung_units(rows).items())]
    return Report(topology.stack, now, True, rows, path_answer, exit_code, verdict, notes,
                  firewall, door_report, lost_nodes(rows), vip_report, hung)
