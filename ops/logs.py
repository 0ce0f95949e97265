"""`kimipd logs`: one timestamped .tar.gz with what an incident needs from every node, collected
in parallel over SSH: each kimipd-* container's `docker logs` and `docker inspect`, and the
node's `nvidia-smi`, `ibstat`, `rdma link` and `docker ps -a`. A tool a node does not have is
noted as absent; a node that cannot be reached is noted as failed; the bundle is always written.

With the door, its container's `docker logs` is the door's access log (HAProxy logs every
request to stdout), and the bundle adds the door's runtime state (`show stat`, `show servers
state`) from its admin socket. With the door on two nodes, each keepalived's container log
(keepalived logs to stdout: every VRRP transition, every advert refused) is among the
containers, and each door node adds what status reads of the virtual IP there: its addresses
(`ip -o -4 addr show`) and keepalived's last state (the file its notify FIFO's reader writes).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import DEGRADED, DOWN, OK
from .door import runtime_api_command
from .remote import RemoteError, Transport
from .topology import DOOR, ContainerRef, Door, Topology
from .virtual_ip import address_command, state_command

# Node-wide diagnostics: file name -> program and arguments. Missing programs are expected
# (no GPUs on a router-only node, no RDMA tools in a minimal install).
NODE_COMMANDS = {
    "nvidia-smi.txt": ["nvidia-smi"],
    "ibstat.txt": ["ibstat"],
    "rdma-link.txt": ["rdma", "link"],
    "docker-ps.txt": ["docker", "ps", "-a", "--filter", "name=^kimipd-",
                      "--format", "table {{.Names}}\t{{.Image}}\t{{.Status}}\t{{.Labels}}"],
}
# The door's runtime state: file name -> runtime API command (ops/door.py sends it).
DOOR_COMMANDS = {
    "door-show-stat.csv": "show stat",
    "door-servers-state.txt": "show servers state",
}
ABSENT = 127  # the shell's "command not found"
_SINCE = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$"
                    r"|^\d{4}-\d\d-\d\d(T[0-9:.]+(Z|[+-]\d\d:\d\d)?)?$"
                    r"|^\d+$")
_TIMESTAMPED = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z ")


def valid_since(value: str) -> str:
    """docker's --since: a duration (1h, 90m, 1h30m), a date/RFC 3339 time, or a Unix time."""
    if not _SINCE.match(value):
        raise ValueError(f"--since {value!r}: use a duration such as 1h or 30m, or a time "
                         "such as 2026-11-29T20:00:00Z")
    return value


@dataclass
class Entry:
    path: str  # inside the bundle
    node: str
    what: str
    command: str
    # ok | absent (tool not installed) | nonzero (a diagnostic ran and failed: its output is
    # kept, it is evidence) | failed (not collected)
    status: str
    exit_status: int | None = None
    bytes: int = 0
    role: str | None = None
    container: str | None = None
    error: str | None = None


def _guarded(argv: list[str]) -> str:
    """Exit 127 without running anything when the program is not installed on the node."""
    return (f"command -v {shlex.quote(argv[0])} >/dev/null 2>&1 || exit {ABSENT}; "
            + shlex.join(argv) + " 2>&1")


def sort_by_timestamp(log: bytes) -> bytes:
    """`docker logs` copies the container's stdout and stderr on two streams, so merged they
    can interleave out of order; with --timestamps every line starts with its time. Lines
    without one (never expected) keep their place after the line before them."""
    keyed, last = [], b""
    for index, line in enumerate(log.splitlines(keepends=True)):
        match = _TIMESTAMPED.match(line)
        if match:
            last = _normalise(match.group(0))
        keyed.append((last, index, line))
    keyed.sort()
    return b"".join(line for _, _, line in keyed)


def _normalise(stamp: bytes) -> bytes:
    # Fractions of variable length compare wrongly as text: pad them to nanoseconds.
    head, _, fraction = stamp.rstrip(b"Z ").partition(b".")
    return head + b"." + fraction.ljust(9, b"0")


class Collector:
    def __init__(self, transport: Transport, since: str, timeout: float) -> None:
        self.transport = transport
        self.since = since
        self.timeout = timeout
        self.files: dict[str, bytes] = {}
        self.entries: list[Entry] = []

    def _run(self, node: str, path: str, what: str, command: str,
             ref: ContainerRef | None = None, diagnostic: bool = False,
             transform=None) -> None:
        entry = Entry(path, node, what, command, "ok", role=ref.role if ref else None,
                      container=ref.name if ref else None)
        try:
            result = self.transport.run(node, command, timeout=self.timeout)
        except RemoteError as error:
            entry.status, entry.error = "failed", str(error)
        else:
            entry.exit_status = result.status
            data = result.stdout + result.stderr
            if diagnostic and result.status == ABSENT:
                entry.status = "absent"
                entry.error = f"{what.split()[0]} is not installed on this node"
            else:
                if result.status != 0:
                    last_lines = (result.err or result.out).strip().splitlines()
                    entry.status = "nonzero" if diagnostic else "failed"
                    entry.error = (last_lines[-1] if last_lines else f"exit {result.status}")[:300]
                if transform is not None and result.status == 0:
                    data = transform(data)
                self.files[path] = data
                entry.bytes = len(data)
        self.entries.append(entry)

    def container(self, ref: ContainerRef) -> list:
        base = f"{ref.node}/{ref.name}"
        logs = shlex.join(["docker", "logs", "--timestamps", "--since", self.since, ref.name])
        inspect = shlex.join(["docker", "inspect", "--type", "container", ref.name])
        return [
            (self._run, ref.node, f"{base}.log", "docker logs", logs + " 2>&1", ref, False,
             sort_by_timestamp),
            (self._run, ref.node, f"{base}.inspect.json", "docker inspect", inspect, ref),
        ]

    def node(self, node: str) -> list:
        return [(self._run, node, f"{node}/{file}", " ".join(argv), _guarded(argv), None,
                 argv[0] != "docker")
                for file, argv in NODE_COMMANDS.items()]

    def door(self, door: Door) -> list:
        """The door's runtime state, read on its node, or on each door node when it stands on
        two (each HAProxy checks the slots on its own; a door that is down refuses: noted)."""
        sockets = ({node.address: node.admin_socket for node in door.nodes}
                   or {door.node: door.admin_socket})
        return [(self._run, node, f"{node}/{file}",
                 f"python3 runtime API: {command}",
                 runtime_api_command(socket, command, min(self.timeout, 10.0)),
                 None, True)
                for node, socket in sockets.items() for file, command in DOOR_COMMANDS.items()]

    def virtual_ip(self, door: Door) -> list:
        """On each door node: who holds the address there and keepalived's last state, as
        `kimipd status` reads them (ops/virtual_ip.py)."""
        if door.virtual_ip is None:
            return []
        jobs = []
        for node in door.nodes:
            jobs += [(self._run, node.address, f"{node.address}/ip-addr.txt",
                      f"ip addr on {door.virtual_ip.interface}",
                      address_command(door.virtual_ip.interface) + " 2>&1", None, True),
                     (self._run, node.address, f"{node.address}/keepalived-state.txt",
                      "keepalived's state file", state_command(node.state_file) + " 2>&1",
                      None, True)]
        return jobs

    def discover(self, node: str) -> list[str]:
        """Every kimipd-* container on the node, running or not."""
        command = shlex.join(["docker", "ps", "-a", "--filter", "name=^kimipd-",
                              "--format", "{{.Names}}"])
        try:
            result = self.transport.run(node, command, timeout=self.timeout)
        except RemoteError:
            return []  # the node's own entries will say why
        return [line.strip() for line in result.out.splitlines() if line.strip()]


def bundle_name(stack: str, when: datetime) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", stack)
    return f"kimipd-logs-{safe}-{when.strftime('%Y%m%dT%H%M%SZ')}"


def collect_bundle(topology: Topology, transport: Transport, out_dir: Path, since: str = "1h",
                   selectors: list[str] | None = None, timeout: float = 60.0,
                   workers: int = 16,
                   on_progress: Callable[[str], None] | None = None) -> tuple[Path, dict, int]:
    """Writes the bundle; returns (its path, its index, the exit code). ON_PROGRESS hears how
    many items are collected, as each one ends."""
    progress = on_progress or (lambda message: None)
    started = datetime.now(timezone.utc)
    clock = time.monotonic()
    collector = Collector(transport, valid_since(since), timeout)
    chosen = topology.select(selectors or [])
    nodes = sorted({ref.node for ref in chosen}) if selectors else list(topology.nodes)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kimipd-logs") as pool:
        if not selectors:
            # Containers the outputs do not list (left over, renamed) are evidence too.
            known = {(ref.node, ref.name) for ref in chosen}
            found = dict(zip(nodes, pool.map(collector.discover, nodes), strict=True))
            for node, names in found.items():
                chosen += [ContainerRef(role=name.removeprefix("kimipd-"), node=node, name=name,
                                        health_url="") for name in names
                           if (node, name) not in known]
        jobs = [job for ref in chosen for job in collector.container(ref)]
        jobs += [job for node in nodes for job in collector.node(node)]
        door = topology.door
        if door is not None and (not selectors or any(ref.role == DOOR or ref.slot is not None
                                                      for ref in chosen)):
            jobs += collector.door(door)
        if door is not None and (not selectors or any(
                ref.role.startswith(("door", "keepalived")) for ref in chosen)):
            jobs += collector.virtual_ip(door)
        progress(f"logs: collecting {len(jobs)} items from {len(nodes)} nodes")
        futures = [pool.submit(*job) for job in jobs]
        for done, future in enumerate(as_completed(futures), 1):
            future.result()
            progress(f"logs: {done}/{len(jobs)} items collected")

    name = bundle_name(topology.stack, started)
    entries = sorted(collector.entries, key=lambda e: e.path)
    failed = [e for e in entries if e.status == "failed"]
    index = {
        "stack": topology.stack,
        "createdAt": started.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - clock, 2),
        "since": since,
        "roles": selectors or [],
        "serving": topology.serving,
        "restartGeneration": topology.restart_generation,
        "nodes": nodes,
        "containers": [{"role": ref.role, "node": ref.node, "container": ref.name}
                       for ref in chosen],
        "files": [asdict(e) for e in entries],
        "failed": len(failed),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.tar.gz"
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        def add(member: str, data: bytes) -> None:
            info = tarfile.TarInfo(f"{name}/{member}")
            info.size, info.mtime, info.mode = len(data), int(started.timestamp()), 0o644
            tar.addfile(info, io.BytesIO(data))

        add("index.json", json.dumps(index, indent=2).encode() + b"\n")
        add("INDEX.txt", index_text(index).encode())
        for entry in entries:
            if entry.path in collector.files:
                add(entry.path, collector.files[entry.path])
    os.replace(partial, path)
    if not any(e.status != "failed" for e in entries):
        code = DOWN  # nothing at all: no outputs, or no node answered
    else:
        code = DEGRADED if failed else OK
    return path, index, code


def index_text(index: dict) -> str:
    lines = [
        f"kimipd logs of stack {index['stack']}, collected {index['createdAt']} "
        f"(docker logs --since {index['since']}"
        + (f", roles {', '.join(index['roles'])}" if index["roles"] else "") + ")",
        f"{len(index['containers'])} containers on {len(index['nodes'])} nodes; "
        f"{index['failed']} item(s) failed",
        "",
        f"{'status':<7} {'bytes':>9}  {'path':<48} what",
    ]
    for entry in index["files"]:
        note = f"  ({entry['error']})" if entry["error"] else ""
        lines.append(f"{entry['status']:<7} {entry['bytes']:>9}  {entry['path']:<48} "
                     f"{entry['what']}{note}")
    return "\n".join(lines) + "\n"
