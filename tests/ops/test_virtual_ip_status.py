"""`kimipd status` with the door on two nodes: who holds the virtual IP (each node's
`ip -o -4 addr show`, faked per node by tests/ops/loopback.py's LocalNodes) and each
keepalived's state (the file its notify script writes, read with `cat` over the transport);
two holders or none is down. The verdict's pure functions first, then the whole status over
the fake stack of tests/ops/door_fakes.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from ops import DEGRADED, DOWN, OK
from ops.probe import Prober
from ops.topology import Topology, VirtualIp
from ops.status import collect
from ops.status_render import render
from ops.virtual_ip import (ABSENT, UNKNOWN, VipNode, holders_verdict, holds_address,
                            keepalived_state, node_problems, virtual_ip_report)
from tests.ops.door_fakes import (KEY, OTHER_DOOR, OTHER_DOOR_NODE, OTHER_KEEPALIVED,
                                  ROUTER_NODE, VIRTUAL_IP, DoorStack)

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
VIP = "10.0.0.9"
IP_SHOWS_IT = (
    "2: bond1    inet 10.0.0.5/24 brd 10.0.0.255 scope global bond1\\       valid_lft forever "
    "preferred_lft forever\n"
    "2: bond1    inet 10.0.0.9/32 scope global bond1\\       valid_lft forever preferred_lft "
    "forever\n")


def node(address: str, keepalived: str = "BACKUP", holds: bool | None = False,
         container: str = "running") -> VipNode:
    return VipNode(address, "running", container if keepalived != ABSENT else "exited (137)",
                   keepalived, holds, None if holds is not None else "ssh: connection refused")


# -- pure functions ------------------------------------------------------------------------------


def test_the_address_is_held_when_ip_lists_it_on_the_interface() -> None:
    assert holds_address(IP_SHOWS_IT, VIP)
    assert not holds_address(IP_SHOWS_IT, "10.0.0.90")  # a prefix of another is not it
    assert not holds_address(IP_SHOWS_IT.splitlines()[0], VIP)
    assert not holds_address("", VIP)


def test_keepalived_s_word_counts_only_while_its_container_runs() -> None:
    assert keepalived_state("running", "MASTER\n") == "MASTER"
    assert keepalived_state("running", "FAULT") == "FAULT"
    # A SIGKILLed keepalived leaves MASTER in the file: its container has exited.
    assert keepalived_state("exited (137)", "MASTER\n") == ABSENT
    assert keepalived_state("absent", None) == ABSENT
    # Not written yet (no transition so far), or the node did not answer.
    assert keepalived_state("running", None) == UNKNOWN
    assert keepalived_state("running", "garbage") == UNKNOWN
    assert keepalived_state("unknown", "MASTER") == UNKNOWN


def test_one_holder_is_the_only_healthy_verdict() -> None:
    assert holders_verdict(VIP, [node("a", "MASTER", True), node("b")]) == (None, [])


def test_two_holders_are_split_brain_and_down() -> None:
    down, problems = holders_verdict(VIP, [node("a", "MASTER", True),
                                           node("b", "MASTER", True)])
    assert down is not None and down.startswith(
        f"split brain: a and b both hold the virtual IP {VIP}; clients reach whichever "
        "answered ARP last")
    assert problems == []


def test_no_holder_is_down_once_both_nodes_answered() -> None:
    down, _ = holders_verdict(VIP, [node("a", "FAULT"), node("b", "FAULT")])
    assert down == (f"no door node holds the virtual IP {VIP}: no request gets in "
                    "(both keepalived FAULT, FAULT)")


def test_a_node_that_did_not_answer_may_hold_it_so_no_holder_seen_is_not_down() -> None:
    down, problems = holders_verdict(VIP, [node("a", UNKNOWN, None), node("b")])
    assert down is None
    assert problems == [f"no door node that answered holds the virtual IP {VIP}; a did not "
                        "say (ssh: connection refused)"]


def test_what_is_wrong_on_one_door_node() -> None:
    def problems(each: VipNode) -> list[str]:
        return node_problems(VIP, "bond1", each)

    assert problems(node("a", "MASTER", True)) == problems(node("b")) == []
    assert problems(node("b", ABSENT)) == [
        "keepalived on b is not running (exited (137)): the address cannot move there"]
    assert problems(node("a", ABSENT, True)) == [
        f"a holds {VIP} with no keepalived running (exited (137)): nothing gives it up if its "
        "door dies"]
    assert problems(node("b", "FAULT")) == [
        "keepalived on b is FAULT (its door does not answer /health, or bond1 is down): it "
        "cannot take the address"]
    assert problems(node("a", "BACKUP", True)) == [f"a holds {VIP} but its keepalived says BACKUP"]
    assert problems(node("a", "MASTER", False)) == [
        f"keepalived on a says MASTER but {VIP} is not on bond1"]
    # A node that did not answer says nothing of itself (the lost node line does).
    assert problems(node("a", UNKNOWN, None)) == []


def test_the_report_names_the_holders() -> None:
    report = virtual_ip_report(VirtualIp(VIP, 32, "bond1", 51),
                               [node("a", "MASTER", True), node("b", ABSENT)])
    assert report.holders == ["a"] and report.down is None and not report.ok
    assert json.loads(json.dumps(report.as_json()))["nodes"][1]["keepalived"] == ABSENT


def test_the_notify_fifo_s_reader_writes_each_state_in_the_order_keepalived_sent_them(
        tmp_path: Path) -> None:
    """virtual-ip.sh --notify-fifo STATE_FILE FIFO (keepalived appends the FIFO): a flap's two
    lines arrive in order and the last state stays; lines that are no state of the instance
    change nothing; the reader ends when the writer closes the FIFO."""
    state, fifo = tmp_path / "state", tmp_path / "notify.fifo"
    os.mkfifo(fifo)
    script = str(REPO / "assets" / "virtual-ip.sh")
    reader = subprocess.Popen(["bash", script, "--notify-fifo", str(state), str(fifo)])
    try:
        with open(fifo, "w") as writer:
            for line in ('INSTANCE "door" BACKUP 100', 'INSTANCE "door" MASTER 100',
                         'INSTANCE "door" BACKUP 100', 'INSTANCE "door" MASTER_RX_LOWER_PRI 100',
                         'GROUP "g" MASTER 100'):
                writer.write(line + "\n")
        assert reader.wait(timeout=30) == 0
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(timeout=10)
    assert state.read_text() == "BACKUP\n"
    assert not (tmp_path / "state.new").exists()
    refused = subprocess.run(["bash", script, "--notify-fifo", str(state)], capture_output=True,
                             text=True, timeout=30, check=False)
    assert refused.returncode == 2 and "--notify-fifo STATE_FILE FIFO" in refused.stderr


# -- the whole status over the fake stack --------------------------------------------------------


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DoorStack]:
    started = DoorStack(tmp_path, two_nodes=True)
    yield started
    started.stop()


# Nothing here waits out a timeout (no node is a black hole): a long one costs nothing, and
# keeps a busy machine (other test sessions beside) from turning an answer into a timeout.
PROBE_TIMEOUT = 10.0


def status(stack: DoorStack):
    nodes = stack.nodes()
    topology = Topology.from_outputs("door", stack.outputs())
    return collect(topology, nodes, Prober(nodes, PROBE_TIMEOUT), PROBE_TIMEOUT,
                   generate_timeout=20, api_key=KEY, router_kind="rust"), nodes


def text(report) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(render(report))
    return console.export_text()


def test_both_doors_both_slots_and_who_holds_the_address(stack: DoorStack) -> None:
    report, nodes = status(stack)
    assert (report.exit_code, report.verdict) == (OK, "serving"), (
        report.notes, report.virtual_ip, [row.problems for row in report.rows])
    assert [row.ref.role for row in report.rows] == [
        "mooncake-master", "prefill-r0", "decode-r0", "door", OTHER_DOOR, "router-a",
        "router-b", "keepalived", OTHER_KEEPALIVED]
    vip = report.virtual_ip
    assert vip is not None and vip.holders == [ROUTER_NODE]
    assert [(n.address, n.door, n.keepalived_container, n.keepalived, n.holds)
            for n in vip.nodes] == [(ROUTER_NODE, "running", "running", "MASTER", True),
                                    (OTHER_DOOR_NODE, "running", "running", "BACKUP", False)]
    # Read on each door node over its own transport: the interface and the state file.
    asked = {(n, c.split()[0]) for n, c in nodes.commands if c.startswith(("ip ", "cat "))}
    assert asked == {(ROUTER_NODE, "ip"), (ROUTER_NODE, "cat"), (OTHER_DOOR_NODE, "ip"),
                     (OTHER_DOOR_NODE, "cat")}
    shown = text(report)
    assert f"virtual IP {VIRTUAL_IP} on bond1: held by {ROUTER_NODE}" in shown
    assert report.as_json()["virtualIp"]["holders"] == [ROUTER_NODE]


def test_after_a_failover_the_other_node_holds_it(stack: DoorStack) -> None:
    stack.hold(OTHER_DOOR_NODE)
    stack.keepalived(ROUTER_NODE, "BACKUP")
    stack.keepalived(OTHER_DOOR_NODE, "MASTER")
    report, _ = status(stack)
    assert report.exit_code == OK and report.virtual_ip.holders == [OTHER_DOOR_NODE]


def test_split_brain_is_down_with_a_line_that_says_so(stack: DoorStack) -> None:
    stack.hold(ROUTER_NODE, OTHER_DOOR_NODE)
    stack.keepalived(OTHER_DOOR_NODE, "MASTER")
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DOWN, "down")
    assert report.notes[0].startswith(f"split brain: {ROUTER_NODE} and {OTHER_DOOR_NODE} both "
                                      f"hold the virtual IP {VIRTUAL_IP}")
    shown = text(report)
    assert f"held by {ROUTER_NODE} and {OTHER_DOOR_NODE} (split brain)" in shown
    assert "virtual IP: split brain:" in shown


def test_no_holder_is_down(stack: DoorStack) -> None:
    stack.hold()
    stack.keepalived(ROUTER_NODE, "FAULT")
    stack.keepalived(OTHER_DOOR_NODE, "FAULT")
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DOWN, "down")
    assert report.notes[0] == (f"no door node holds the virtual IP {VIRTUAL_IP}: no request "
                               "gets in (both keepalived FAULT, FAULT)")
    assert "held by no door node" in text(report)


def test_a_dead_keepalived_on_the_other_node_is_degraded(stack: DoorStack) -> None:
    """The address stays where it is, but cannot move: the operator is told which and why."""
    stack.kill(OTHER_KEEPALIVED)
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DEGRADED, "degraded")
    assert report.virtual_ip.holders == [ROUTER_NODE]
    assert report.virtual_ip.nodes[1].keepalived == ABSENT
    assert report.virtual_ip.problems == [
        f"keepalived on {OTHER_DOOR_NODE} is not running (exited (137)): the address cannot "
        "move there"]


def test_router_node_s_door_dead_and_the_address_moved_is_degraded_not_down(
        stack: DoorStack) -> None:
    """Its keepalived went FAULT and the other door node took the address: requests get in
    through the other door, so the stack serves, short of a spare."""
    stack.kill("door")
    stack.exporter.stop()
    stack.hold(OTHER_DOOR_NODE)
    stack.keepalived(ROUTER_NODE, "FAULT")
    stack.keepalived(OTHER_DOOR_NODE, "MASTER")
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DEGRADED, "degraded"), report.notes
    assert report.door.open and report.virtual_ip.holders == [OTHER_DOOR_NODE]
    assert f"the door's container on {ROUTER_NODE} is exited (137)" in report.door.problems
    assert report.virtual_ip.problems == [
        f"keepalived on {ROUTER_NODE} is FAULT (its door does not answer /health, or bond1 is "
        "down): it cannot take the address"]


# -- each door's view of both slots --------------------------------------------------------------


def slots(report) -> dict:
    return {slot.name: slot for slot in report.door.slots}


def test_each_door_s_view_of_both_slots_is_read_on_its_node(stack: DoorStack) -> None:
    """Each door checks both slots on its own: its runtime API is read on its node, and each
    slot shows what each door makes of it."""
    stack.admins[OTHER_DOOR_NODE].servers["slot-a"] = {"scur": "3", "lastchg": "12"}
    report, nodes = status(stack)
    assert report.exit_code == OK, (report.notes, report.door.problems)
    runtime_api = {node: command for node, command in nodes.commands
                   if command.startswith("python3 ")}
    assert runtime_api.keys() == {ROUTER_NODE, OTHER_DOOR_NODE}
    for node, admin in stack.admins.items():
        assert admin.path in runtime_api[node] and admin.commands == ["show stat"], node
    a = slots(report)["a"]
    assert {node: (view.state, view.sessions, view.check, view.since_change)
            for node, view in a.at_doors.items()} == {
        ROUTER_NODE: ("UP", 0, "L7OK", 302), OTHER_DOOR_NODE: ("UP", 3, "L7OK", 12)}
    assert (a.at_door, a.sessions) == ("UP", 0)  # router.node's door's, as with one door node
    shown = text(report)
    assert (f"door {stack.door_url} (plain HTTP) on {ROUTER_NODE} (running), "
            f"{OTHER_DOOR_NODE} (running); GET /health 200") in shown
    assert f"at the door on {ROUTER_NODE}" in shown and f"at the door on {OTHER_DOOR_NODE}" in shown
    assert "UP, 3 in flight, L7OK, 12s" in shown and "UP, 0 in flight, L7OK, 5m02s" in shown
    document = report.as_json()["door"]
    assert document["slots"][0]["atDoors"][OTHER_DOOR_NODE] == {
        "state": "UP", "sessions": 3, "check": "L7OK", "sinceChangeSeconds": 12}
    assert document["runtimeApiErrors"] == {}


def test_a_slot_one_door_sees_down_says_which_door(stack: DoorStack) -> None:
    """The other door still sends it requests: degraded, not a slot out."""
    stack.admins[ROUTER_NODE].servers["slot-b"] = {"status": "DOWN", "check_status": "L4TOUT"}
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DEGRADED, "degraded")
    b = slots(report)["b"]
    assert b.serving and b.problems == [f"DOWN at the door on {ROUTER_NODE}"]
    assert report.door.problems == []
    assert [slot.name for slot in report.door.serving_slots] == ["a", "b"]
    assert "DOWN, 0 in flight, L4TOUT" in text(report)


def test_the_holder_s_door_sending_to_no_slot_is_down(stack: DoorStack) -> None:
    """Every request reaches the holder's door, which fails it, however the other door sees
    the slots."""
    for server in ("slot-a", "slot-b"):
        stack.admins[ROUTER_NODE].servers[server] = {"status": "DOWN"}
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DOWN, "down")
    assert report.notes[0] == (f"no slot serves at the door on {ROUTER_NODE}, which holds the "
                               "virtual IP: every request fails")
    assert f"the door on {ROUTER_NODE} sends to no slot" in report.door.problems
    assert report.door.answer.status == 503  # HAProxy itself, on the holder


def test_the_other_door_sending_to_no_slot_is_degraded(stack: DoorStack) -> None:
    """Nothing reaches it until the address moves there: a spare that would fail."""
    for server in ("slot-a", "slot-b"):
        stack.admins[OTHER_DOOR_NODE].servers[server] = {"status": "DOWN"}
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DEGRADED, "degraded")
    assert report.door.problems == [f"the door on {OTHER_DOOR_NODE} sends to no slot"]
    assert report.path is not None and report.path.ok


def test_one_door_s_runtime_api_unread_leaves_the_other_s_view(stack: DoorStack) -> None:
    stack.admins[OTHER_DOOR_NODE].stop()
    report, _ = status(stack)
    assert (report.exit_code, report.verdict) == (DEGRADED, "degraded")
    (error,) = report.door.stat_errors.values()
    assert list(report.door.stat_errors) == [OTHER_DOOR_NODE]
    assert error.endswith("[Errno 2] No such file or directory")
    assert report.door.problems == [f"runtime API on {OTHER_DOOR_NODE}: {error}"]
    assert report.door.stat_error == f"{OTHER_DOOR_NODE}: {error}"
    assert all(slot.at_doors[ROUTER_NODE].state == "UP" and slot.serving
               and slot.at_doors[OTHER_DOOR_NODE].state is None for slot in report.door.slots)
    assert "unknown" in text(report)
