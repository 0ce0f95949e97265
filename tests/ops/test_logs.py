"""`kimipd logs`: the bundle's contents, collected through a fake SSH transport."""

from __future__ import annotations

import json
import shlex
import tarfile
import threading
from pathlib import Path

import pytest

from ops import DEGRADED, OK
from ops.cli import main
from ops.logs import collect_bundle, sort_by_timestamp, valid_since
from ops.remote import RemoteError, RemoteResult
from ops.topology import Topology
from tests.outputs import complete_outputs

NODES = [f"10.9.0.{i}" for i in range(1, 5)]


def outputs() -> dict:
    """A two-node-per-group stack as `pulumi stack output --json` prints it."""
    containers = {
        "mooncake-master": {"node": NODES[0], "container": "kimipd-mooncake-master",
                            "healthUrl": f"http://{NODES[0]}:9003/health"},
        "prefill-r0": {"node": NODES[0], "container": "kimipd-prefill-r0",
                       "healthUrl": f"http://{NODES[0]}:30000/health"},
        "prefill-r1": {"node": NODES[1], "container": "kimipd-prefill-r1",
                       "healthUrl": f"http://{NODES[1]}:30000/health"},
        "decode-r0": {"node": NODES[2], "container": "kimipd-decode-r0",
                      "healthUrl": f"http://{NODES[2]}:30000/health"},
        "decode-r1": {"node": NODES[3], "container": "kimipd-decode-r1",
                      "healthUrl": f"http://{NODES[3]}:30000/health"},
        "router": {"node": NODES[2], "container": "kimipd-router",
                   "healthUrl": f"http://{NODES[2]}:31000/health"},
    }
    return complete_outputs({
        "serving": True, "restartGeneration": 2, "containers": containers,
        "groups": {"prefill": {"mode": "prefill", "endpoint": f"http://{NODES[0]}:30000",
                               "nodes": NODES[:2]},
                   "decode": {"mode": "decode", "endpoint": f"http://{NODES[2]}:30000",
                              "nodes": NODES[2:]}},
        "nodes": {node: {"roles": []} for node in NODES},
        "routerUrl": f"http://{NODES[2]}:31000", "generateUrl": f"http://{NODES[2]}:31000/generate",
    })


class CannedNodes:
    """Answers what `logs` asks a node. NODES[1] has no GPU tools, NODES[3] cannot be reached;
    NODES[0] also has a kimipd container the outputs do not list."""

    def __init__(self, unreachable=(NODES[3],)) -> None:
        self.unreachable = set(unreachable)
        self.commands: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.names = {NODES[0]: ["kimipd-mooncake-master", "kimipd-prefill-r0", "kimipd-old-router"],
                      NODES[1]: ["kimipd-prefill-r1"], NODES[2]: ["kimipd-decode-r0", "kimipd-router"],
                      NODES[3]: ["kimipd-decode-r1"]}

    def close(self) -> None:
        pass

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        with self._lock:
            self.commands.append((node, command))
        if node in self.unreachable:
            raise RemoteError(f"ssh {node}:22: no answer within {timeout:g}s")
        argv = shlex.split(command.removesuffix(" 2>&1"))

        def ok(out: str, status: int = 0, err: str = "") -> RemoteResult:
            return RemoteResult(node, command, status, out.encode(), err.encode())

        if argv[:3] == ["docker", "ps", "-a"] and "{{.Names}}" in argv:
            return ok("".join(name + "\n" for name in self.names[node]))
        if argv[:2] == ["docker", "logs"]:
            name = argv[-1]
            # stderr's line came through after stdout's later one: the bundle puts it back
            return ok(f"2026-11-29T20:00:01.500000000Z {name} second\n"
                      f"2026-11-29T20:00:01.25Z {name} first (stderr)\n"
                      f"2026-11-29T20:00:02.000000001Z {name} third\n")
        if argv[:2] == ["docker", "inspect"]:
            return ok(json.dumps([{"Name": "/" + argv[-1], "State": {"Status": "running"}}]))
        if argv[:2] == ["command", "-v"]:
            tool = argv[2]
            if tool in ("nvidia-smi", "ibstat", "rdma") and node == NODES[1]:
                return ok("", 127)
            if tool == "rdma" and node == NODES[0]:  # present, and failing: evidence too
                return ok("Failed to open NETLINK_RDMA socket\n", 1)
            return ok(f"{tool} output on {node}\n")
        raise AssertionError(f"unexpected command {command!r}")


def read_bundle(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {member.name.split("/", 1)[1]: tar.extractfile(member).read().decode()
                for member in tar.getmembers()}


def test_every_container_and_node_in_one_bundle(tmp_path: Path) -> None:
    nodes = CannedNodes()
    path, index, code = collect_bundle(Topology.from_outputs("pro6000", outputs()), nodes,
                                       tmp_path, since="2h")
    assert code == DEGRADED  # NODES[3] could not be reached
    assert path.parent == tmp_path and path.name.startswith("kimipd-logs-pro6000-")
    assert path.name.endswith(".tar.gz") and not list(tmp_path.glob("*.partial"))
    files = read_bundle(path)
    with tarfile.open(path) as tar:
        assert {m.name.split("/", 1)[0] for m in tar.getmembers()} == {path.name[:-7]}
    reached = ["kimipd-mooncake-master", "kimipd-prefill-r0", "kimipd-old-router"]
    for name in reached:
        log = files[f"{NODES[0]}/{name}.log"]
        assert log.splitlines() == [
            f"2026-11-29T20:00:01.25Z {name} first (stderr)",
            f"2026-11-29T20:00:01.500000000Z {name} second",
            f"2026-11-29T20:00:02.000000001Z {name} third"]
        assert json.loads(files[f"{NODES[0]}/{name}.inspect.json"])[0]["Name"] == "/" + name
    for node, name in ((NODES[1], "kimipd-prefill-r1"), (NODES[2], "kimipd-decode-r0"),
                       (NODES[2], "kimipd-router")):
        assert f"{node}/{name}.log" in files and f"{node}/{name}.inspect.json" in files
    assert files[f"{NODES[0]}/nvidia-smi.txt"] == f"nvidia-smi output on {NODES[0]}\n"
    assert files[f"{NODES[2]}/rdma-link.txt"] == f"rdma output on {NODES[2]}\n"
    assert f"{NODES[1]}/nvidia-smi.txt" not in files  # absent: noted, not a file
    assert files[f"{NODES[0]}/rdma-link.txt"] == "Failed to open NETLINK_RDMA socket\n"

    document = json.loads(files["index.json"])
    assert document == index
    assert document["stack"] == "pro6000" and document["since"] == "2h"
    assert document["nodes"] == NODES and document["restartGeneration"] == 2
    assert {c["container"] for c in document["containers"]} == {
        "kimipd-mooncake-master", "kimipd-prefill-r0", "kimipd-prefill-r1", "kimipd-decode-r0",
        "kimipd-decode-r1", "kimipd-router", "kimipd-old-router"}
    status = {entry["path"]: entry for entry in document["files"]}
    assert status[f"{NODES[1]}/ibstat.txt"]["status"] == "absent"
    assert status[f"{NODES[1]}/ibstat.txt"]["error"] == "ibstat is not installed on this node"
    assert (status[f"{NODES[0]}/rdma-link.txt"]["status"],
            status[f"{NODES[0]}/rdma-link.txt"]["exit_status"]) == ("nonzero", 1)
    lost = status[f"{NODES[3]}/kimipd-decode-r1.log"]
    assert (lost["status"], lost["role"]) == ("failed", "decode-r1")
    assert "no answer within" in lost["error"]
    assert document["failed"] == 6  # decode-r1's log and inspect, NODES[3]'s four node files
    logs = [c for n, c in nodes.commands if " logs " in c]
    assert all(c.startswith("docker logs --timestamps --since 2h kimipd-") for c in logs), logs
    assert "failed  " in files["INDEX.txt"] and "absent  " in files["INDEX.txt"]
    assert f"{NODES[0]}/kimipd-prefill-r0.log" in files["INDEX.txt"]


def test_role_narrows_to_its_containers_and_nodes(tmp_path: Path) -> None:
    nodes = CannedNodes(unreachable=())
    path, index, code = collect_bundle(Topology.from_outputs("sim", outputs()), nodes, tmp_path,
                                       selectors=["decode"])
    assert code == OK
    assert [c["role"] for c in index["containers"]] == ["decode-r0", "decode-r1"]
    assert index["nodes"] == NODES[2:]
    assert {n for n, _ in nodes.commands} == set(NODES[2:])
    files = read_bundle(path)
    assert sorted(f for f in files if f.endswith(".log")) == [
        f"{NODES[2]}/kimipd-decode-r0.log", f"{NODES[3]}/kimipd-decode-r1.log"]
    # a group name, a role, a prefix
    for selectors, roles in ((["prefill-r1"], ["prefill-r1"]), (["mooncake"], ["mooncake-master"]),
                             (["router", "prefill-r0"], ["prefill-r0", "router"])):
        chosen = Topology.from_outputs("sim", outputs()).select(selectors)
        assert [ref.role for ref in chosen] == roles


def test_cli_prints_where_the_bundle_is(tmp_path: Path, capsys) -> None:
    (tmp_path / "outputs.json").write_text(json.dumps(outputs()))
    (tmp_path / "config.json").write_text("{}")
    nodes = CannedNodes(unreachable=())
    code = main(["-s", "pro6000", "--outputs-json", str(tmp_path / "outputs.json"),
                 "--config-json", str(tmp_path / "config.json"), "logs", "--out",
                 str(tmp_path / "out"), "--since", "30m"], transport_factory=lambda a: nodes)
    text = capsys.readouterr().out
    assert code == OK, text
    (bundle,) = (tmp_path / "out").glob("kimipd-logs-pro6000-*.tar.gz")
    assert f"bundle: {bundle} (7 containers on 4 nodes" in text
    assert f"absent: nvidia-smi on {NODES[1]}\n" in text and "0 failed; exit 0" in text
    assert (f"exit 1: rdma link (Failed to open NETLINK_RDMA socket; output kept) on {NODES[0]}\n"
            in text)


def test_since_is_checked() -> None:
    for good in ("1h", "30m", "1h30m", "2026-11-29", "2026-11-29T20:00:00Z", "1764446400"):
        assert valid_since(good) == good
    for bad in ("1 hour", "yesterday", "1h; rm -rf /"):
        with pytest.raises(ValueError):
            valid_since(bad)


def test_lines_sort_by_timestamp_keeping_continuations() -> None:
    log = (b"2026-11-29T20:00:02Z b\n  continued\n2026-11-29T20:00:01.9Z a\n")
    assert sort_by_timestamp(log) == (b"2026-11-29T20:00:01.9Z a\n2026-11-29T20:00:02Z b\n"
                                      b"  continued\n")


def test_nothing_reachable_is_exit_2(tmp_path: Path) -> None:
    nodes = CannedNodes(unreachable=NODES)
    path, index, code = collect_bundle(Topology.from_outputs("pro6000", outputs()), nodes,
                                       tmp_path)
    assert code == 2 and path.exists()
    assert index["failed"] == len(index["files"]) > 0
