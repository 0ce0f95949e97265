"""`kimipd logs` of a stack with the door: the door's access log (its container's docker logs),
its runtime state from the admin socket, and --role door / router-a / router (both slots)."""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import OK
from ops.cli import main
from ops.logs import collect_bundle
from ops.remote import RemoteResult
from ops.topology import Topology
from tests.ops.door_fakes import (OTHER_DOOR_NODE, OTHER_KEEPALIVED, ROUTER_NODE, VIRTUAL_IP,
                                  AdminSocket, DoorStack)
from tests.ops.test_logs import read_bundle
from tests.ops.test_stack import DOOR_NODE, door_outputs

ACCESS_LOG = ("2026-12-01T10:00:01.000000000Z 10.0.0.9:51234 [01/Dec/2026:10:00:01.000] door "
              "slots/slot-a 0/0/0/41/41 200 312 - - ---- 1/1/0/0/0 0/0 \"POST /generate "
              "HTTP/1.1\"\n")


class DoorNodes:
    """Canned docker answers; the runtime API's python3 runs here against a fake socket."""

    def __init__(self, outputs: dict) -> None:
        self.names = {}
        for entry in outputs["containers"].values():
            self.names.setdefault(entry["node"], []).append(entry["container"])
        self.commands: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        pass

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        with self._lock:
            self.commands.append((node, command))
        argv = shlex.split(command.removesuffix(" 2>&1"))

        def ok(out: str, status: int = 0) -> RemoteResult:
            return RemoteResult(node, command, status, out.encode(), b"")

        if argv[0] == "python3":
            done = subprocess.run(["bash", "-c", command], capture_output=True, timeout=timeout)
            return RemoteResult(node, command, done.returncode, done.stdout, done.stderr)
        if argv[:3] == ["docker", "ps", "-a"] and "{{.Names}}" in argv:
            return ok("".join(name + "\n" for name in self.names[node]))
        if argv[:2] == ["docker", "logs"]:
            if argv[-1] == "kimipd-door":
                return ok(ACCESS_LOG)
            return ok(f"2026-12-01T10:00:00Z {argv[-1]} up\n")
        if argv[:2] == ["docker", "inspect"]:
            return ok(json.dumps([{"Name": "/" + argv[-1], "State": {"Status": "running"}}]))
        if argv[:2] == ["command", "-v"]:
            return ok(f"{argv[2]} output\n")
        raise AssertionError(f"unexpected command {command!r}")


@pytest.fixture
def admin() -> Iterator[AdminSocket]:
    socket = AdminSocket()
    yield socket
    socket.stop()


def outputs_with(admin: AdminSocket) -> dict:
    outputs = door_outputs()
    outputs["door"]["adminSocket"] = admin.path
    return outputs


def test_the_bundle_has_the_doors_access_log_and_its_runtime_state(tmp_path: Path,
                                                                   admin: AdminSocket) -> None:
    admin.servers["slot-b"] = {"status": "DRAIN"}
    outputs = outputs_with(admin)
    heard: list[str] = []
    path, index, code = collect_bundle(Topology.from_outputs("door", outputs),
                                       DoorNodes(outputs), tmp_path, on_progress=heard.append)
    assert code == OK, index["files"]
    # The live line: the count first, then each item as it ends, up to all of them.
    total = int(heard[0].split()[2])
    assert heard == [heard[0], *(f"logs: {done}/{total} items collected"
                                 for done in range(1, total + 1))], heard
    files = read_bundle(path)
    assert files[f"{DOOR_NODE}/kimipd-door.log"] == ACCESS_LOG
    for name in ("kimipd-router-a", "kimipd-router-b"):
        assert f"{DOOR_NODE}/{name}.log" in files and f"{DOOR_NODE}/{name}.inspect.json" in files
    stat = files[f"{DOOR_NODE}/door-show-stat.csv"]
    assert stat.startswith("# pxname,svname,") and "slots,slot-b," in stat and ",DRAIN," in stat
    assert files[f"{DOOR_NODE}/door-servers-state.txt"].startswith("1\n# be_id be_name")
    assert sorted(admin.commands) == ["show servers state", "show stat"]
    entries = {entry["path"]: entry for entry in index["files"]}
    assert entries[f"{DOOR_NODE}/door-show-stat.csv"]["what"] == (
        "python3 runtime API: show stat")
    assert {c["role"] for c in index["containers"]} >= {"door", "router-a", "router-b"}


@pytest.mark.parametrize(("selectors", "logs", "runtime"), [
    (["door"], ["kimipd-door"], True),
    (["router-a"], ["kimipd-router-a"], True),
    (["router"], ["kimipd-router-a", "kimipd-router-b"], True),
    (["decode"], ["kimipd-decode-r0"], False),
])
def test_role_selects_the_door_and_its_slots(tmp_path: Path, admin: AdminSocket,
                                             selectors: list[str], logs: list[str],
                                             runtime: bool) -> None:
    outputs = outputs_with(admin)
    nodes = DoorNodes(outputs)
    path, index, code = collect_bundle(Topology.from_outputs("door", outputs), nodes, tmp_path,
                                       selectors=selectors)
    assert code == OK
    files = read_bundle(path)
    assert sorted(f.split("/")[1].removesuffix(".log") for f in files if f.endswith(".log")) == logs
    assert (f"{DOOR_NODE}/door-show-stat.csv" in files) == runtime
    assert any("python3" in command for _, command in nodes.commands) == runtime


def test_a_door_whose_socket_refuses_keeps_the_error_as_evidence(tmp_path: Path,
                                                                 admin: AdminSocket,
                                                                 capsys) -> None:
    outputs = outputs_with(admin)
    outputs["door"]["adminSocket"] = str(tmp_path / "gone.sock")
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    (tmp_path / "config.json").write_text("{}")
    code = main(["-s", "door", "--outputs-json", str(tmp_path / "outputs.json"),
                 "--config-json", str(tmp_path / "config.json"), "logs", "--role", "door",
                 "--out", str(tmp_path / "out")], transport_factory=lambda a: DoorNodes(outputs))
    text = capsys.readouterr().out
    assert code == OK, text  # a diagnostic that ran and failed is kept, not a failure
    assert "exit 1: python3 runtime API: show stat (FileNotFoundError: [Errno 2] No such file " \
           f"or directory; output kept) on {DOOR_NODE}" in text


# -- the door on two nodes ----------------------------------------------------------------------


class TwoDoorNodes(DoorNodes):
    """DoorNodes with each door node's addresses and keepalived's state file (read here)."""

    def __init__(self, outputs: dict, holders: dict[str, list[str]]) -> None:
        super().__init__(outputs)
        self.holders = holders

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        argv = shlex.split(command.removesuffix(" 2>&1"))
        if argv[:2] == ["ip", "-o"]:
            with self._lock:
                self.commands.append((node, command))
            out = "".join(f"2: bond1    inet {address}/32 scope global bond1\n"
                          for address in self.holders[node])
            return RemoteResult(node, command, 0, out.encode(), b"")
        if argv[0] == "cat":
            with self._lock:
                self.commands.append((node, command))
            return RemoteResult(node, command, 0, Path(argv[1]).read_bytes(), b"")
        if argv[:2] == ["docker", "logs"] and argv[-1] == "kimipd-keepalived":
            with self._lock:
                self.commands.append((node, command))
            return RemoteResult(node, command, 0, (
                f"2026-12-01T10:00:00.100000000Z Keepalived_vrrp: (door) Entering "
                f"{'MASTER' if node == ROUTER_NODE else 'BACKUP'} STATE\n").encode(), b"")
        return super().run(node, command, timeout, stdin, on_stdout)


def test_each_keepalived_s_log_and_each_door_node_s_hold_on_the_address(
        tmp_path: Path) -> None:
    stack = DoorStack(tmp_path, two_nodes=True)
    try:
        outputs = stack.outputs()
        nodes = TwoDoorNodes(outputs, stack.addresses)
        path, index, code = collect_bundle(Topology.from_outputs("door", outputs), nodes,
                                           tmp_path / "out", selectors=["keepalived"])
        files = read_bundle(path)
        whole, _, whole_code = collect_bundle(Topology.from_outputs("door", outputs), nodes,
                                              tmp_path / "whole")
        everything = read_bundle(whole)
    finally:
        stack.stop()
    assert code == OK, [f for f in index["files"] if f["status"] != "ok"]
    assert [c["role"] for c in index["containers"]] == ["keepalived", OTHER_KEEPALIVED]
    assert "Entering MASTER STATE" in files[f"{ROUTER_NODE}/kimipd-keepalived.log"]
    assert "Entering BACKUP STATE" in files[f"{OTHER_DOOR_NODE}/kimipd-keepalived.log"]
    assert VIRTUAL_IP in files[f"{ROUTER_NODE}/ip-addr.txt"]
    assert VIRTUAL_IP not in files[f"{OTHER_DOOR_NODE}/ip-addr.txt"]
    assert files[f"{ROUTER_NODE}/keepalived-state.txt"] == "MASTER\n"
    assert files[f"{OTHER_DOOR_NODE}/keepalived-state.txt"] == "BACKUP\n"
    # Without --role: both doors' runtime state too (each HAProxy checks the slots on its own).
    assert whole_code == OK
    assert {f"{node}/{name}" for node in (ROUTER_NODE, OTHER_DOOR_NODE)
            for name in ("door-show-stat.csv", "ip-addr.txt", "keepalived-state.txt",
                         "kimipd-keepalived.log", "kimipd-door.log")} <= set(everything)
