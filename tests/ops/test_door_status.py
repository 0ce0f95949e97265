"""`kimipd status` of a stack with the door (tests/ops/door_fakes.py): the door's port, each
slot's readiness and state at the door (HAProxy's runtime API read with python3 over the nodes'
transport), where each group stands in each slot, and the verdict."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from components.config import VerificationSpec
from ops import DEGRADED, DOWN, OK
from ops.cli import main
from ops.door import RUNTIME_API_SCRIPT, RuntimeApiError, parse_show_stat, serving_at_door
from ops.probe import Prober, tls_check
from ops.remote import RemoteResult
from ops.topology import Topology
from ops.status import collect
from ops.status_render import render
from ops.verify import run as verify_run
from tests.ops.door_fakes import KEY, ROUTER_NODE, DoorStack, show_stat

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DoorStack]:
    started = DoorStack(tmp_path)
    yield started
    started.stop()


def status(stack: DoorStack, kind: str = "rust", api_key: str | None = KEY, nodes=None,
           tls=None, outputs=None):
    topology = Topology.from_outputs("door", outputs or stack.outputs())
    nodes = nodes or stack.nodes()
    return collect(topology, nodes, Prober(nodes, 3.0, tls=tls), 3.0, generate_timeout=10,
                   api_key=api_key, router_kind=kind)


def text(report) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(render(report))
    return console.export_text()


def slots(report) -> dict:
    return {slot.name: slot for slot in report.door.slots}


def test_a_door_stack_that_serves_shows_the_door_both_slots_and_each_group_in_each(
        stack: DoorStack) -> None:
    nodes = stack.nodes()
    stack.slots["a"].members["prefill"] = (True, True, 2)
    report = status(stack, nodes=nodes)
    assert (report.exit_code, report.verdict) == (OK, "serving"), (report.door, report.notes)
    assert [row.ref.role for row in report.rows] == [
        "mooncake-master", "prefill-r0", "decode-r0", "door", "router-a", "router-b"]
    door = report.door
    assert door.open and door.container == "running" and door.answer.status == 200
    assert door.problems == [] and [s.name for s in door.serving_slots] == ["a", "b"]
    a = slots(report)["a"]
    assert (a.at_door, a.check, a.sessions, a.since_change, a.readiness.status) == (
        "UP", "L7OK", 0, 302, 200)
    assert a.readiness.url == stack.slots["a"].url + "/pairs"
    assert [(m.group, m.mode, m.registered, m.healthy, m.load) for m in a.members] == [
        ("prefill", "prefill", True, True, 2), ("decode", "decode", True, True, 0)]
    # GET /workers with the router's key, on each slot; the runtime API read on the router's
    # node with python3 (no socat there)
    assert ("GET", "/workers", f"Bearer {KEY}") in stack.slots["b"].requests
    ((node, command),) = [(n, c) for n, c in nodes.commands if "python3" in c]
    assert node == ROUTER_NODE
    assert RUNTIME_API_SCRIPT.splitlines()[0] in command and stack.admin.path in command
    assert stack.admin.commands == ["show stat"]
    # the path goes through the door
    assert report.path.url == stack.door_url + "/generate" and report.path.ok
    shown = text(report)
    print(shown)
    assert f"door {stack.door_url} (plain HTTP) on {ROUTER_NODE}: container running; GET " \
           "/health 200" in shown
    assert "serving slots: a, b" in shown
    for word in ("slot", "ready", "at door", "in flight", "router-a", "L7OK", "5m02s",
                 "in slot a", "in slot b", "healthy, load 2", "6/6 containers ok; exit 0"):
        assert word in shown, shown
    document = report.as_json()["door"]
    assert document["servingSlots"] == ["a", "b"] and document["tls"] is False
    assert document["slots"][0]["members"][0] == {"group": "prefill", "mode": "prefill",
                                                  "registered": True, "healthy": True,
                                                  "load": 2}


def test_a_dead_slot_while_the_other_serves_is_degraded(stack: DoorStack) -> None:
    stack.kill_slot("b")
    report = status(stack)
    assert (report.exit_code, report.verdict) == (DEGRADED, "degraded")
    b = slots(report)["b"]
    assert b.container == "exited (137)" and b.at_door == "DOWN" and not b.serving
    assert b.problems[:3] == ["container exited (137)",
                              "not ready (GET /pairs: connection refused)",
                              "DOWN at the door"]
    assert slots(report)["a"].serving and slots(report)["a"].problems == []
    assert report.door.problems == ["slot b does not serve; a carries every request"]
    rows = {row.ref.role: row for row in report.rows}
    assert rows["router-b"].problems[0] == "exited (exit 137)"
    assert rows["door"].ok and rows["router-a"].ok
    assert report.path.ok  # the door still serves every request
    shown = text(report)
    assert "serving slots: a" in shown and "door: slot b does not serve" in shown


@pytest.mark.parametrize("state", ["DRAIN", "MAINT", "DOWN 1/2", "NOLB"])
def test_a_slot_the_door_does_not_send_requests_to_is_degraded(stack: DoorStack,
                                                                state: str) -> None:
    stack.admin.servers["slot-a"] = {"status": state}
    report = status(stack)
    assert report.exit_code == DEGRADED
    assert slots(report)["a"].problems == [f"{state} at the door"]
    assert [s.name for s in report.door.serving_slots] == ["b"]


def test_a_slot_one_check_short_of_down_still_serves(stack: DoorStack) -> None:
    stack.admin.servers["slot-a"] = {"status": "UP 1/2"}
    assert slots(status(stack))["a"].serving


def test_a_check_in_progress_shows_the_last_result(stack: DoorStack) -> None:
    # HAProxy prefixes check_status with "* " while the next check runs.
    stack.admin.servers["slot-a"] = {"check_status": "* L7OK"}
    assert slots(status(stack))["a"].check == "L7OK"


def test_a_slot_not_ready_is_degraded_even_before_the_door_notices(stack: DoorStack) -> None:
    stack.slots["b"].ready = False
    report = status(stack)
    assert report.exit_code == DEGRADED
    assert slots(report)["b"].problems == ["not ready (GET /pairs: 503)"]


def test_no_slot_serving_is_down(stack: DoorStack) -> None:
    stack.kill_slot("a")
    stack.kill_slot("b")
    report = status(stack)
    assert (report.exit_code, report.verdict) == (DOWN, "down")
    assert "no slot serves at the door: every request fails" in report.notes
    assert report.door.answer.status == 503  # HAProxy answers itself
    assert "no slot serves" in report.door.problems
    assert "stack door: down" in text(report)


def test_a_dead_door_is_down(stack: DoorStack) -> None:
    stack.kill("door")
    stack.door.stop()
    stack.exporter.stop()
    report = status(stack)
    assert (report.exit_code, report.verdict) == (DOWN, "down")
    assert "the door does not take connections: no request gets in" in report.notes
    assert report.door.container == "exited (137)"
    assert {row.ref.role: row.ok for row in report.rows}["door"] is False


def test_a_group_missing_from_one_slot_is_shown_in_that_slot(stack: DoorStack) -> None:
    stack.slots["b"].members["decode"] = (False, False, 0)
    stack.slots["a"].members["decode"] = (True, False, 0)
    report = status(stack)
    assert report.exit_code == DEGRADED
    assert slots(report)["b"].problems == ["decode not registered"]
    assert slots(report)["a"].problems == ["decode unhealthy"]
    shown = text(report)
    assert "not registered" in shown and "unhealthy, load 0" in shown


def test_without_the_runtime_api_the_slots_readiness_decides(stack: DoorStack,
                                                              tmp_path: Path) -> None:
    outputs = stack.outputs()
    outputs["door"]["adminSocket"] = str(tmp_path / "gone.sock")
    report = status(stack, outputs=outputs)
    assert report.exit_code == DEGRADED  # cannot tell what the door does
    assert report.door.stat_error.endswith("[Errno 2] No such file or directory")
    assert report.door.problems == [f"runtime API: {report.door.stat_error}"]
    assert [s.name for s in report.door.serving_slots] == ["a", "b"]
    assert all(slot.at_door is None for slot in report.door.slots)
    assert "unknown" in text(report)


def test_no_python3_on_the_node_says_so(stack: DoorStack) -> None:
    class NoPython:
        def __init__(self, inner) -> None:
            self.inner = inner

        def run(self, node, command, timeout, stdin=None, on_stdout=None):
            if command.startswith("python3 "):
                return RemoteResult(node, command, 127, b"", b"python3: command not found\n")
            return self.inner.run(node, command, timeout, stdin, on_stdout)

        def close(self) -> None:
            pass

    report = status(stack, nodes=NoPython(stack.nodes()))
    assert report.door.stat_error == f"python3 is not installed on {ROUTER_NODE}"


def test_minilb_slots_are_checked_on_health_and_have_no_worker_api(stack: DoorStack) -> None:
    for slot in stack.slots.values():
        slot.kind = "mini-lb"
    report = status(stack, kind="mini-lb", api_key=None)
    assert report.exit_code == OK, report.door
    assert slots(report)["a"].readiness.url.endswith("/health")
    assert all(slot.members is None for slot in report.door.slots)
    assert not [r for s in stack.slots.values() for r in s.requests if r[1] == "/workers"]
    assert "groups in slots: MiniLB: every group is on each slot's command line" in text(report)


def test_a_stack_without_a_door_reads_no_runtime_api(stack: DoorStack) -> None:
    outputs = stack.outputs()
    del outputs["door"]
    nodes = stack.nodes()
    report = status(stack, outputs=outputs, nodes=nodes)
    assert report.door is None and "door" not in report.as_json()
    assert not [c for _, c in nodes.commands if "python3" in c]
    assert "serving slots" not in text(report)


def test_tls_door_is_verified_against_the_configured_ca(tmp_path: Path, capsys) -> None:
    stack = DoorStack(tmp_path, tls=True)
    try:
        assert stack.door_url.startswith("https://")
        assert stack.ca is not None
        report = status(stack, tls=tls_check(stack.ca, None))
        assert report.exit_code == OK, report.door
        assert report.door.tls_verification == "verified against router.door.tls.caCertificate"
        assert report.path.ok
        # Against the system's store alone the private CA fails: the door's port is refused.
        refused = status(stack)
        assert "certificate verify failed" in (refused.door.answer.error or "")
        # Through the CLI: the CA comes from the stack's config; without it, not verified.
        outputs, config = tmp_path / "outputs.json", tmp_path / "config.json"
        outputs.write_text(json.dumps(stack.outputs()))
        config.write_text(json.dumps({"kimipd:router": {"value": "", "secret": False,
                                                        "objectValue": {
                                                            "node": ROUTER_NODE, "kind": "rust",
                                                            "door": {"tls": {
                                                                "certificate": "x",
                                                                "caCertificate": stack.ca}}}}}))
        argv = ["-s", "door", "--outputs-json", str(outputs), "--config-json", str(config),
                "status", "--json"]
        assert main(argv, transport_factory=lambda access: stack.nodes()) == OK
        document = json.loads(capsys.readouterr().out)
        # no routerApiKey in an injected config: the slots' /workers are not asked
        assert document["door"]["membership"] == "not asked: no routerApiKey at hand"
        assert document["door"]["tlsVerification"] == (
            "verified against router.door.tls.caCertificate")
        assert document["door"]["health"]["status"] == 200
        config.write_text("{}")
        assert main(argv[:-1], transport_factory=lambda access: stack.nodes()) == OK
        shown = capsys.readouterr().out
        assert (f"door {stack.door_url} (TLS, not verified (router.door.tls is not in the "
                "config at hand))") in shown
        assert "groups in slots: MiniLB" in shown
    finally:
        stack.stop()


def test_verify_reaches_a_door_behind_a_private_ca(tmp_path: Path, capsys) -> None:
    """`kimipd verify` checks the door's certificate as status does: against caCertificate
    from the config (the fake door answers /generate with one JSON body, not a stream, so the
    measurement itself is not judged here, only that the request got through TLS)."""
    stack = DoorStack(tmp_path, tls=True)
    try:
        assert stack.ca is not None
        spec = VerificationSpec(baseline=[{"name": "warmup", "inputTokens": 6,
                                           "outputTokens": 16}])
        topology = Topology.from_outputs("door", stack.outputs())
        verified = verify_run(topology, spec, transport=None, tls=tls_check(stack.ca, None))
        assert verified.measurements[0].status == 200, verified.as_json()
        assert verified.measurements[0].via == "direct"
        # The system's store alone refuses the private CA; verify says so, not "unreachable".
        refused = verify_run(topology, spec, transport=None)
        assert "certificate verify failed" in (refused.measurements[0].error or "")
        assert refused.measurements[0].status is None
        # Through the CLI: the CA comes from the stack's config.
        outputs, config = tmp_path / "outputs.json", tmp_path / "config.json"
        outputs.write_text(json.dumps(stack.outputs()))
        config.write_text(json.dumps({
            "kimipd:router": {"value": "", "secret": False, "objectValue": {
                "node": ROUTER_NODE, "kind": "rust",
                "door": {"tls": {"certificate": "x", "caCertificate": stack.ca}}}},
            "kimipd:verification": {"value": "", "secret": False, "objectValue": {
                "baseline": [{"name": "warmup", "inputTokens": 6, "outputTokens": 16}]}}}))
        main(["-s", "door", "--outputs-json", str(outputs), "--config-json", str(config),
              "verify", "--json", "--via", "direct"], transport_factory=lambda access: stack.nodes())
        document = json.loads(capsys.readouterr().out)
        assert document["requests"][0]["status"] == 200, document
    finally:
        stack.stop()


def test_show_stat_is_read_by_its_header() -> None:
    stat = parse_show_stat(show_stat({"slot-a": {"status": "DRAIN", "scur": "3"},
                                      "slot-b": {"status": "no check"}}))
    assert stat[("slots", "slot-a")]["status"] == "DRAIN"
    assert stat[("slots", "slot-a")]["scur"] == "3"
    assert stat[("slots", "BACKEND")]["status"] == "DOWN"
    assert stat[("door", "FRONTEND")]["status"] == "OPEN"
    # another version's columns, in another order and fewer
    other = "# svname,pxname,status,scur\nslot-a,slots,UP,1\n"
    assert parse_show_stat(other)[("slots", "slot-a")] == {"svname": "slot-a",
                                                           "pxname": "slots", "status": "UP",
                                                           "scur": "1"}
    with pytest.raises(RuntimeApiError, match="without its header line: Permission denied"):
        parse_show_stat("Permission denied.\n")
    assert [state for state in ("UP", "UP 1/2", "no check", "DOWN", "DOWN 1/2", "DRAIN",
                                "MAINT", "MAINT(via)", "NOLB") if serving_at_door(state)] == [
        "UP", "UP 1/2", "no check"]


class Recording:
    """A node that answers every curl with 200 and keeps the command lines."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        self.commands.append(command)
        return RemoteResult(node, command, 0, b'{"workers": []}\nKIMIPD-HTTP 200 0.001\n', b"")

    def close(self) -> None:
        pass


def test_over_ssh_a_slot_is_asked_with_the_doors_key_file_and_https_unverified() -> None:
    node = Recording()
    prober = Prober(node, 2.0, via="ssh")
    answer = prober.request("GET", "http://10.0.0.5:31001/workers", "10.0.0.5", api_key="k",
                            router_port=31000)
    assert answer.status == 200 and answer.via == "ssh"
    # the key's header file lives under router.port (the door's), not the slot's port
    assert "-H @/opt/kimipd/router-31000/auth-header" in node.commands[-1]
    assert "--insecure" not in node.commands[-1] and " k " not in node.commands[-1]
    prober.request("GET", "http://10.0.0.5:31000/workers", "10.0.0.5", api_key="k")
    assert "-H @/opt/kimipd/router-31000/auth-header" in node.commands[-1]  # as before
    prober.get("https://10.0.0.5:31000/health", "10.0.0.5")
    assert "--insecure" in node.commands[-1]  # curl on the door's own node
