"""The door as the day-two tools see it (`status`, `logs`): HAProxy's runtime API read over SSH on
the router's node (on each door node when the door stands on two: each door checks both slots on
its own), each slot's readiness, and each slot's own view of the groups (GET /workers).

The runtime API is a UNIX socket on the node (the `door` output's adminSocket). The nodes have no
socat: a few lines of python3 send one command and print the answer; HAProxy closes the socket
after answering a command sent without `prompt`.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from components.outputs import GroupOutput
from components.render import slot_check_path

from .probe import HttpAnswer, Prober, settled
from .remote import RemoteError, Transport, run_patiently
from .topology import Door, Slot

# One runtime API command (argv[3]) on the socket argv[1], within argv[2] seconds; the answer on
# stdout. A failure is Python's own last line on stderr (PermissionError, ConnectionRefusedError).
RUNTIME_API_SCRIPT = """\
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(float(sys.argv[2]))
s.connect(sys.argv[1])
s.sendall(sys.argv[3].encode() + b"\\n")
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    sys.stdout.buffer.write(chunk)
"""
NOT_INSTALLED = 127


def runtime_api_command(socket_path: str, command: str, timeout: float) -> str:
    return shlex.join(["python3", "-c", RUNTIME_API_SCRIPT, socket_path, f"{timeout:g}",
                       command])


class RuntimeApiError(Exception):
    """The door's runtime API could not be read (no socket, refused, not allowed, no python3)."""


def runtime_api(transport: Transport, node: str, socket_path: str, command: str,
                timeout: float) -> str:
    """COMMAND's answer from the door's admin socket on NODE."""
    try:
        # `show stat` and `show table` only read: a slow node is asked again.
        result = run_patiently(transport, node, runtime_api_command(socket_path, command,
                                                                     timeout), timeout + 5)
    except RemoteError as error:
        raise RuntimeApiError(str(error)) from None
    if result.status == NOT_INSTALLED:
        raise RuntimeApiError(f"python3 is not installed on {node}")
    if result.status != 0:
        raise RuntimeApiError(f"{socket_path} on {node}: {result.failure}")
    return result.out


# `show table door_clients`: `0x55d0...: key=alice use=0 exp=0 http_req_cnt=12` per client.
_TABLE_ENTRY = re.compile(r"\bkey=(\S+) .*\bhttp_req_cnt=(\d+)")


def parse_client_counts(text: str) -> dict[str, int]:
    """Client name -> requests the door has counted since it (re)loaded, from `show table`."""
    if not text.lstrip().startswith("# table:"):
        raise RuntimeApiError("`show table` answered without its header line: "
                              + (text.strip()[:160] or "nothing"))
    return {found.group(1): int(found.group(2))
            for found in map(_TABLE_ENTRY.search, text.splitlines()) if found}


def parse_show_stat(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """`show stat`'s CSV by (pxname, svname); the columns named by its header line (`# pxname,
    svname,qcur,...`), so their order and number (they grow between versions) do not matter."""
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if header_at is None:
        raise RuntimeApiError("`show stat` answered without its header line: "
                              + (text.strip()[:160] or "nothing"))
    reader = csv.reader(io.StringIO("\n".join(
        [lines[header_at][2:], *[line for line in lines[header_at + 1:] if line.strip()]])))
    columns = next(reader)
    rows = {}
    for values in reader:
        row = dict(zip(columns, values, strict=False))
        if "pxname" in row and "svname" in row:
            rows[(row["pxname"], row["svname"])] = row
    return rows


def serving_at_door(state: str) -> bool:
    """A server the door sends new requests to: UP (also `UP 1/2`, one failed check short of
    DOWN) or `no check`; not DOWN, MAINT, DRAIN or NOLB."""
    return state.startswith("UP") or state == "no check"


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


@dataclass
class Member:
    """Where one group stands in one slot (the slot's GET /workers)."""

    group: str
    mode: str | None
    registered: bool
    healthy: bool | None = None
    load: int | None = None

    def summary(self) -> str:
        if not self.registered:
            return "not registered"
        load = f", load {self.load}" if self.load is not None else ""
        return ("healthy" if self.healthy else "unhealthy") + load


def members(body: str, groups: Mapping[str, GroupOutput]) -> list[Member]:
    """Every group of the stack in a rust router's GET /workers answer, matched by its endpoint
    (the URL its Membership registers)."""
    workers = json.loads(body)["workers"]
    by_url = {str(worker.get("url", "")).rstrip("/"): worker for worker in workers}
    found = []
    for name, group in groups.items():
        worker = by_url.get(group.endpoint.rstrip("/"))
        load = worker.get("load") if worker else None
        found.append(Member(name, group.mode, worker is not None,
                            bool(worker.get("is_healthy")) if worker else None,
                            load if isinstance(load, int) else None))
    return found


@dataclass
class AtDoor:
    """One slot as one door sees it: its server's line in that door's `show stat`."""

    # UP, DOWN, DRAIN, MAINT, "UP 1/2", "no check"; None: that door's runtime API was not
    # read, or its backend has no such server.
    state: str | None = None
    sessions: int | None = None  # scur: requests in flight through that door
    check: str | None = None  # check_status: L7OK, L7STS, L4CON, ...
    since_change: int | None = None  # lastchg: seconds since its state last changed

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "sessions": self.sessions, "check": self.check,
                "sinceChangeSeconds": self.since_change}


@dataclass
class SlotReport:
    name: str
    role: str
    url: str
    server: str
    container: str  # its docker state, as the container's row says ("running", "exited (137)")
    readiness: HttpAnswer
    # Door node -> the slot as that node's door sees it, router.node's first; one entry with
    # the door on router.node alone.
    at_doors: dict[str, AtDoor] = field(default_factory=dict)
    members: list[Member] | None = None  # None: not asked (MiniLB, no routerApiKey)
    members_error: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def _first(self) -> AtDoor:
        return next(iter(self.at_doors.values()), AtDoor())

    # router.node's door's view (the only door's, on one door node).
    @property
    def at_door(self) -> str | None:
        return self._first.state

    @property
    def sessions(self) -> int | None:
        return self._first.sessions

    @property
    def check(self) -> str | None:
        return self._first.check

    @property
    def since_change(self) -> int | None:
        return self._first.since_change

    @property
    def serving(self) -> bool:
        """A door sends it requests (the doors' word where it could be read, else the slot's own
        readiness)."""
        read = [view.state for view in self.at_doors.values() if view.state is not None]
        if read:
            return any(serving_at_door(state) for state in read)
        return self.container == "running" and self.readiness.ok

    def as_json(self) -> dict[str, Any]:
        return {"slot": self.name, "role": self.role, "url": self.url, "server": self.server,
                "container": self.container, "readiness": self.readiness.as_json(),
                "atDoor": self.at_door, "sessions": self.sessions, "check": self.check,
                "sinceChangeSeconds": self.since_change,
                "atDoors": {node: view.as_json() for node, view in self.at_doors.items()},
                "serving": self.serving,
                "members": ([asdict(member) for member in self.members]
                            if self.members is not None else None),
                "membersError": self.members_error, "problems": self.problems}


@dataclass
class DoorReport:
    url: str
    tls: bool
    tls_verification: str | None  # what the certificate was checked against; None: plain HTTP
    node: str
    container: str  # its docker state
    answer: HttpAnswer  # GET DOOR/health: through the door to a slot
    slots: list[SlotReport]
    # Door node -> why its runtime API could not be read (no entry: it was).
    stat_errors: dict[str, str] = field(default_factory=dict)
    membership: str = ""  # how the slots' view of the groups was asked, or why not
    problems: list[str] = field(default_factory=list)
    # On two door nodes: each door node's door container state (router.node's is `container`
    # too); {} with one door node.
    doors: dict[str, str] = field(default_factory=dict)
    # With client keys: door node -> client name -> requests counted since that door loaded
    # (a node whose table could not be read is left out).
    clients: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def stat_error(self) -> str | None:
        """Why the runtime API could not be read (on two door nodes, each that could not)."""
        if not self.stat_errors:
            return None
        if not self.doors:
            return next(iter(self.stat_errors.values()))
        return "; ".join(f"{node}: {error}" for node, error in self.stat_errors.items())

    @property
    def serving_slots(self) -> list[SlotReport]:
        return [slot for slot in self.slots if slot.serving]

    def serving_at(self, node: str) -> list[str] | None:
        """The slots NODE's door sends requests to; None when its runtime API was not read."""
        if node in self.stat_errors:
            return None
        return [slot.name for slot in self.slots
                if serving_at_door(slot.at_doors.get(node, AtDoor()).state or "")]

    @property
    def ok(self) -> bool:
        return not self.problems and not any(slot.problems for slot in self.slots)

    @property
    def open(self) -> bool:
        """The door takes connections: its container runs and its port answered HTTP. On two
        door nodes the port is the virtual IP's, and either door may be the one behind it."""
        running = (any(state == "running" for state in self.doors.values()) if self.doors
                   else self.container == "running")
        return running and self.answer.status is not None

    def as_json(self) -> dict[str, Any]:
        return {"url": self.url, "tls": self.tls, "tlsVerification": self.tls_verification,
                "node": self.node, "container": self.container, "health": self.answer.as_json(),
                "doors": self.doors or None,
                "runtimeApiError": self.stat_error, "runtimeApiErrors": self.stat_errors,
                "membership": self.membership,
                "servingSlots": [slot.name for slot in self.serving_slots],
                "clientRequests": self.clients or None,
                "slots": [slot.as_json() for slot in self.slots], "problems": self.problems}


class DoorProbes:
    """The door's probes, submitted to the status's pool with the rest, read once it is done."""

    def __init__(self, door: Door, groups: Mapping[str, GroupOutput], transport: Transport,
                 prober: Prober, timeout: float, api_key: str | None, router_kind: str) -> None:
        self.door = door
        self.groups = groups
        self.transport = transport
        self.prober = prober
        self.timeout = timeout
        self.api_key = api_key
        self.router_kind = router_kind
        self.answer: Future | None = None
        # Door node -> its door's `show stat`: router.node's, and the other door node's too.
        self.stats: dict[str, Future] = {}
        self.readiness: dict[str, Future] = {}
        self.workers: dict[str, Future] = {}
        self.clients: dict[str, Future] = {}

    @property
    def asks_members(self) -> bool:
        return self.router_kind == "rust" and self.api_key is not None

    def submit(self, pool: ThreadPoolExecutor) -> list[Future]:
        door = self.door
        self.answer = pool.submit(self.prober.get, door.url.rstrip("/") + "/health", door.node)
        sockets = ({node.address: node.admin_socket for node in door.nodes}
                   or {door.node: door.admin_socket})
        self.stats = {node: pool.submit(self._show_stat, node, socket)
                      for node, socket in sockets.items()}
        path = slot_check_path(self.router_kind)
        self.readiness = {slot.name: pool.submit(self.prober.get,
                                                 slot.check_url or slot.url.rstrip("/") + path,
                                                 door.node) for slot in door.slots}
        self.workers = {
            slot.name: pool.submit(self.prober.request, "GET", slot.url.rstrip("/") + "/workers",
                                   door.node, api_key=self.api_key, router_port=door.port)
            for slot in door.slots} if self.asks_members else {}
        table = door.clients_table
        self.clients = {node: pool.submit(self._client_counts, node, socket, table)
                        for node, socket in sockets.items()} if table else {}
        return [self.answer, *self.stats.values(), *self.readiness.values(),
                *self.workers.values(), *self.clients.values()]

    def _client_counts(self, node: str, socket: str, table: str) -> dict[str, int]:
        return parse_client_counts(runtime_api(self.transport, node, socket,
                                               f"show table {table}", self.timeout))

    def _show_stat(self, node: str, socket: str) -> dict[tuple[str, str], dict[str, str]]:
        return parse_show_stat(runtime_api(self.transport, node, socket, "show stat",
                                           self.timeout))

    def report(self, containers: Mapping[str, str], tls_verification: str | None) -> DoorReport:
        """CONTAINERS: role -> docker state, from the status's rows."""
        door = self.door
        answer = settled(self.answer, HttpAnswer(door.url + "/health", "-", error="timed out"))
        stats: dict[str, dict[tuple[str, str], dict[str, str]]] = {}
        stat_errors: dict[str, str] = {}
        for node, future in self.stats.items():
            if not future.done():
                stat_errors[node] = "the runtime API did not answer in time"
                continue
            try:
                stats[node] = future.result()
            except (RuntimeApiError, csv.Error) as error:
                stat_errors[node] = str(error)
        if self.asks_members:
            membership = "each slot's GET /workers"
        elif self.router_kind != "rust":
            membership = "MiniLB: every group is on each slot's command line"
        else:
            membership = "not asked: no routerApiKey at hand"
        report = DoorReport(door.url, door.tls, tls_verification if door.tls else None,
                            door.node, containers.get("door", "unknown"), answer, [],
                            stat_errors, membership,
                            doors={node.address: containers.get(node.door_role, "unknown")
                                   for node in door.nodes})
        for node, future in self.clients.items():
            try:
                if future.done():
                    report.clients[node] = future.result()
            except RuntimeApiError:
                pass  # counts only: the door's state is judged from `show stat`
        path = slot_check_path(self.router_kind)
        for slot in door.slots:
            report.slots.append(self._slot(slot, containers.get(slot.role, "unknown"), stats,
                                           path))
        report.problems = self._door_problems(report)
        return report

    def _slot(self, slot: Slot, container: str,
              stats: dict[str, dict[tuple[str, str], dict[str, str]]], path: str) -> SlotReport:
        readiness = settled(self.readiness.get(slot.name),
                            HttpAnswer(slot.check_url or slot.url + path, "-",
                                       error="timed out"))
        report = SlotReport(slot.name, slot.role, slot.url, slot.server, container, readiness)
        two_doors = bool(self.door.nodes)
        for node in self.stats:
            view = report.at_doors.setdefault(node, AtDoor())
            stat = stats.get(node)
            if stat is None:
                continue
            at = f"the door's on {node}" if two_doors else "the door's"
            row = stat.get((self.door.backend, slot.server))
            if row is None:
                report.problems.append(f"{at} backend {self.door.backend} has no server "
                                       f"{slot.server}")
                continue
            view.state = row.get("status") or None
            view.sessions = _int(row.get("scur"))
            # "* L7OK" while the next check runs: the last result is what it reports.
            view.check = (row.get("check_status") or "").removeprefix("* ") or None
            view.since_change = _int(row.get("lastchg"))
        if slot.name in self.workers:
            answer = settled(self.workers[slot.name],
                             HttpAnswer(slot.url + "/workers", "-", error="timed out"))
            try:
                if answer.status != 200:
                    raise ValueError(answer.summary())
                report.members = members(answer.body, self.groups)
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                report.members_error = f"GET /workers: {error}"
        if container != "running":
            report.problems.append(f"container {container}")
        if not readiness.ok:
            report.problems.append(f"not ready (GET {path}: {readiness.summary()})")
        for node, view in report.at_doors.items():
            if view.state is not None and not serving_at_door(view.state):
                report.problems.append(f"{view.state} at the door"
                                       + (f" on {node}" if two_doors else ""))
        if report.members_error:
            report.problems.append(report.members_error)
        for member in report.members or []:
            if not member.registered:
                report.problems.append(f"{member.group} not registered")
            elif not member.healthy:
                report.problems.append(f"{member.group} unhealthy")
        return report

    def _door_problems(self, report: DoorReport) -> list[str]:
        problems = []
        if report.doors:
            problems += [f"the door's container on {node} is {state}"
                         for node, state in report.doors.items() if state != "running"]
        elif report.container != "running":
            problems.append(f"the door's container is {report.container}")
        if not report.answer.ok:
            problems.append(f"GET {report.url}/health through the door: "
                            f"{report.answer.summary()}")
        for node, error in report.stat_errors.items():
            problems.append(f"runtime API on {node}: {error}" if report.doors
                            else f"runtime API: {error}")
        if report.doors:
            # Each door sends to the slots it sees up: one that sees none fails every request
            # that reaches it (status is down when it holds the virtual IP).
            problems += [f"the door on {node} sends to no slot" for node in report.doors
                         if report.serving_at(node) == []]
        serving = report.serving_slots
        if not serving:
            problems.append("no slot serves")
        elif len(serving) < len(report.slots):
            down = [slot.name for slot in report.slots if not slot.serving]
            problems.append(f"slot {', '.join(down)} does not serve; "
                            f"{', '.join(slot.name for slot in serving)} carries every request")
        return problems
