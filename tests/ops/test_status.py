"""`kimipd status` against a PD deployment on loopback (stand-in groups, the real MiniLB), the
nodes' SSH replaced by a local fake. Tests run in file order; the last one kills a rank."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from rich.console import Console

from ops import DEGRADED, DOWN, OK
from ops import probe as probe_module
from ops.cli import main
from ops.probe import Prober
from ops.topology import Topology
from ops.status import collect
from ops.verdict import note_lost_since
from ops.status_render import render
from tests.ops.loopback import LocalNodes, LoopbackCluster, start_cluster, stop_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LoopbackCluster]:
    started = start_cluster(tmp_path_factory.mktemp("ops-status"))
    yield started
    stop_cluster(started)


def status(cluster: LoopbackCluster, nodes: LocalNodes | None = None, via: str = "auto",
           timeout: float = 3.0, **outputs):
    topology = Topology.from_outputs("loopback", cluster.outputs(**outputs))
    nodes = nodes or LocalNodes(cluster.containers())
    return collect(topology, nodes, Prober(nodes, timeout, via), timeout, generate_timeout=30)


def rows(report) -> dict:
    return {row.ref.role: row for row in report.rows}


def test_all_serving_is_exit_0_with_every_container_in_order(cluster: LoopbackCluster) -> None:
    report = status(cluster)
    assert report.exit_code == OK, [(r.ref.role, r.problems) for r in report.rows]
    assert [row.ref.role for row in report.rows] == [
        "mooncake-master", "prefill-r0", "prefill-r1", "decode-r0", "decode-r1", "router"]
    for row in report.rows:
        assert (row.docker.state, row.docker.generation, row.health.status, row.health.via) == (
            "running", "0", 200, "direct"), row
    assert report.path.status == 200 and report.path.via == "direct"
    assert report.path.url == cluster.router_url + "/generate"


def test_table_and_json_through_the_cli(cluster: LoopbackCluster, tmp_path, capsys) -> None:
    outputs, config = tmp_path / "outputs.json", tmp_path / "config.json"
    outputs.write_text(json.dumps(cluster.outputs()))
    config.write_text("{}")
    nodes = LocalNodes(cluster.containers())
    argv = ["-s", "loopback", "--outputs-json", str(outputs), "--config-json", str(config)]
    assert main(argv + ["status"], transport_factory=lambda access: nodes) == OK
    table = capsys.readouterr().out
    assert "stack loopback: serving" in table
    for word in ("role", "node", "container", "state", "uptime", "gen", "health", "via",
                 "kimipd-decode-r1", "127.0.0.4", "running", "direct"):
        assert word in table, table
    assert "POST " + cluster.router_url + "/generate (1 token) via direct: 200 in" in table
    assert "6/6 containers ok; exit 0" in table
    # -s after the subcommand, as pulumi takes it
    assert main(["--outputs-json", str(outputs), "--config-json", str(config), "status",
                 "-s", "loopback", "--json"], transport_factory=lambda access: nodes) == OK
    document = json.loads(capsys.readouterr().out)
    assert document["stack"] == "loopback" and document["exitCode"] == 0
    assert document["generate"]["status"] == 200
    decode1 = next(c for c in document["containers"] if c["role"] == "decode-r1")
    assert decode1 | {"health": None, "uptimeSeconds": None, "startedAt": None} == {
        "role": "decode-r1", "group": "decode", "rank": 1, "node": "127.0.0.4",
        "container": "kimipd-decode-r1", "state": "running", "exitCode": 0,
        "startedAt": None, "uptimeSeconds": None, "restartGeneration": "0",
        "dockerError": None, "health": None, "ok": True, "problems": []}
    assert decode1["uptimeSeconds"] >= 0
    assert decode1["health"]["via"] == "direct" and decode1["health"]["status"] == 200


def cli_with_reconcile_state(cluster: LoopbackCluster, tmp_path, monkeypatch,
                             memory: dict) -> list[str]:
    """The CLI's arguments for CLUSTER's outputs, with MEMORY as reconcile's state file."""
    outputs, config = tmp_path / "outputs.json", tmp_path / "config.json"
    outputs.write_text(json.dumps(cluster.outputs()))
    config.write_text("{}")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    state = tmp_path / "state" / "kimipd" / "reconcile-loopback.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps(memory))
    return ["-s", "loopback", "--outputs-json", str(outputs), "--config-json", str(config)]


def test_status_says_what_reconcile_last_failed_and_since_when_a_node_is_lost(
        cluster: LoopbackCluster, tmp_path, capsys, monkeypatch) -> None:
    argv = cli_with_reconcile_state(cluster, tmp_path, monkeypatch, {
        "units": {}, "last_failure": "decode-drain: not drained",
        "lost_since": {"127.0.0.4": 1_800_000_000.0}})
    nodes = LocalNodes(cluster.containers(), unreachable={"127.0.0.4"})
    assert main(argv + ["status", "--json"], transport_factory=lambda access: nodes) == DEGRADED
    document = json.loads(capsys.readouterr().out)
    assert "reconcile: the last heal failed: decode-drain: not drained" in " ".join(
        document["notes"])
    assert document["lostNodes"][0]["node"] == "127.0.0.4"
    assert document["lostNodes"][0]["since"] == "2027-01-15T08:00:00+00:00"


def test_watch_refreshes_until_interrupted(cluster: LoopbackCluster, tmp_path, capsys,
                                          monkeypatch) -> None:
    outputs, config = tmp_path / "outputs.json", tmp_path / "config.json"
    outputs.write_text(json.dumps(cluster.outputs()))
    config.write_text("{}")
    rounds = []

    def sleep(seconds: float) -> None:
        rounds.append(seconds)
        if len(rounds) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("ops.status_cli.time.sleep", sleep)
    nodes = LocalNodes(cluster.containers())
    argv = ["-s", "loopback", "--outputs-json", str(outputs), "--config-json", str(config),
            "status", "--watch", "--interval", "0.5"]
    assert main(argv + ["--json"], transport_factory=lambda access: nodes) == OK
    documents = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(documents) == 2 and rounds == [0.5, 0.5]
    assert all(d["exitCode"] == 0 and len(d["containers"]) == 6 for d in documents)
    rounds.clear()
    assert main(argv, transport_factory=lambda access: nodes) == OK  # the live table
    assert "6/6 containers ok; exit 0" in capsys.readouterr().out


def test_via_ssh_probes_with_curl_on_the_node(cluster: LoopbackCluster) -> None:
    nodes = LocalNodes(cluster.containers())
    report = status(cluster, nodes, via="ssh")
    assert report.exit_code == OK, [(r.ref.role, r.problems) for r in report.rows]
    assert {row.health.via for row in report.rows} == {"ssh"} and report.path.via == "ssh"
    curls = [(node, command) for node, command in nodes.commands if command.startswith("curl")]
    assert ("127.0.0.4", next(c for n, c in curls if n == "127.0.0.4")) in curls
    assert any("--data-binary @-" in command for _, command in curls)  # the /generate body


class _Unroutable(httpx.HTTPTransport):
    """This machine cannot open a connection to BLOCKED (a firewall between the operator and
    the compute network), everything else goes through."""

    blocked = "127.0.0.4"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == self.blocked:
            raise httpx.ConnectError("[Errno 113] No route to host", request=request)
        return super().handle_request(request)


def test_auto_falls_back_to_ssh_where_the_port_is_not_reachable(cluster, monkeypatch) -> None:
    monkeypatch.setattr(probe_module, "direct_client",
                        lambda timeout: httpx.Client(transport=_Unroutable(), timeout=timeout))
    report = status(cluster)
    assert report.exit_code == OK
    via = {row.ref.role: row.health.via for row in report.rows}
    assert via.pop("decode-r1") == "ssh"
    assert set(via.values()) == {"direct"}
    text = _text(report)
    assert "decode-r1" in text and " ssh " in text


def _text(report) -> str:
    from rich.console import Console

    console = Console(width=220, record=True, file=open("/dev/null", "w"))
    console.print(render(report))
    return console.export_text()


def test_a_container_of_another_generation_is_degraded(cluster: LoopbackCluster) -> None:
    report = status(cluster, restart_generation=1)
    assert report.exit_code == DEGRADED
    assert all("generation 0, stack has 1 (pulumi up pending)" in row.problems
               for row in report.rows)


def test_serving_false_or_no_outputs_is_exit_2(cluster: LoopbackCluster, tmp_path, capsys) -> None:
    assert status(cluster, serving=False).exit_code == DOWN
    empty = tmp_path / "outputs.json"
    empty.write_text("{}")
    config = tmp_path / "config.json"
    config.write_text("{}")
    code = main(["-s", "gone", "--outputs-json", str(empty), "--config-json", str(config),
                 "status"], transport_factory=lambda access: LocalNodes({}))
    assert code == DOWN
    assert "stack gone: down" in capsys.readouterr().out


def test_nothing_reachable_is_exit_2(cluster: LoopbackCluster) -> None:
    outputs = cluster.outputs()
    # every address on a port where nothing listens, every node refusing SSH
    for entry in outputs["containers"].values():
        entry["healthUrl"] = "http://127.0.0.9:9/health"
    outputs["generateUrl"] = "http://127.0.0.9:9/generate"
    topology = Topology.from_outputs("loopback", outputs)
    nodes = LocalNodes({}, unreachable=set(topology.nodes))
    report = collect(topology, nodes, Prober(nodes, 2.0), 2.0, generate_timeout=5)
    assert (report.exit_code, report.verdict) == (DOWN, "unreachable")


def test_a_dead_node_costs_its_own_rows_not_the_table(cluster: LoopbackCluster) -> None:
    # 127.0.0.4 (decode rank 1) stops answering: SSH hangs, its HTTP port accepts and never replies
    hung = socket.socket()
    hung.bind(("127.0.0.4", 0))
    hung.listen(16)
    try:
        outputs = cluster.outputs()
        outputs["containers"]["decode-r1"]["healthUrl"] = (
            f"http://127.0.0.4:{hung.getsockname()[1]}/health")
        topology = Topology.from_outputs("loopback", outputs)
        nodes = LocalNodes(cluster.containers(), black_holes={"127.0.0.4"})
        started = time.monotonic()
        report = collect(topology, nodes, Prober(nodes, 1.0), 1.0, generate_timeout=60)
        elapsed = time.monotonic() - started
    finally:
        hung.close()
    # The dead node's probes end at their 1 s timeouts (direct, then over SSH): ~2-3 s in all.
    # One not bounded by its timeout would hold the table until collect's backstop,
    # max(3 x 1 s, generate_timeout 60 s) + 10 s = 70 s.
    assert elapsed < 20, f"one dead node held the table for {elapsed:.1f}s"
    assert report.exit_code == DEGRADED
    by_role = rows(report)
    dead = by_role.pop("decode-r1")
    assert dead.docker.state == "unknown" and "no answer within 1s" in dead.docker.error
    assert dead.health.status is None and dead.health.error == "timed out"
    assert all(row.ok for row in by_role.values())
    # The lost node is named first, before the table: what failed, what runs there, since when.
    assert [lost.node for lost in report.lost] == ["127.0.0.4"]
    lost = report.lost[0]
    assert (lost.ssh, lost.roles) == (False, ["decode-r1"]) and "no answer" in lost.error
    note_lost_since(report, {"127.0.0.4": 1_800_000_000.0})
    text = Console(width=400, record=True)
    text.print(render(report))
    first = text.export_text().splitlines()[0]
    assert first.startswith("node 127.0.0.4 lost since 08:00:00 UTC: SSH and the docker "
                            "engine do not answer"), first
    assert "runs decode-r1" in first and "nodes[].out" in first
    assert report.as_json()["lostNodes"][0]["runs"] == ["decode-r1"]


def test_a_busy_docker_engine_is_asked_again_not_called_lost(cluster: LoopbackCluster) -> None:
    # SSH answers and the first `docker inspect` outlasts the probe's timeout (an engine busy
    # starting containers): status asks once more with a longer timeout and the row is served.
    nodes = LocalNodes(cluster.containers(), slow_engines={"127.0.0.4"})
    report = status(cluster, nodes, timeout=1.0)
    inspections = [command for node, command in nodes.commands
                   if node == "127.0.0.4" and command.startswith("docker inspect")]
    assert len(inspections) == 2, nodes.commands
    assert (report.exit_code, report.verdict, report.lost) == (OK, "serving", [])


def test_a_docker_answer_cut_short_is_unknown_not_absent(cluster: LoopbackCluster) -> None:
    # Exit 0 and no JSON (an SSH channel closed under load): nothing is known of the node's
    # containers; read as "absent", reconcile once healed running containers with a no-op.
    nodes = LocalNodes(cluster.containers(), cut_answers={"127.0.0.4"})
    report = status(cluster, nodes, timeout=1.0)
    on_node = [row for row in report.rows if row.ref.node == "127.0.0.4"]
    assert on_node and all(row.docker.state == "unknown" for row in on_node), on_node
    assert all("gave no JSON" in row.docker.error for row in on_node), on_node


def test_a_node_whose_firewall_table_is_gone_is_degraded_and_says_how_to_put_it_back(
        cluster: LoopbackCluster) -> None:
    outputs = cluster.outputs()
    outputs["firewall"] = outputs["firewall"] | {"enabled": True, "table": "inet kimipd_31000"}
    topology = Topology.from_outputs("loopback", outputs)
    node = topology.nodes[0]
    every = LocalNodes(cluster.containers())
    report = collect(topology, every, Prober(every, 3.0), 3.0, generate_timeout=30)
    assert report.exit_code == OK, report.notes
    assert report.firewall == dict.fromkeys(topology.nodes, "present")
    assert ("nft list table inet kimipd_31000 >/dev/null" in
            {command for _, command in every.commands})
    gone = LocalNodes(cluster.containers(), without_firewall={node})
    report = collect(topology, gone, Prober(gone, 3.0), 3.0, generate_timeout=30)
    assert report.exit_code == DEGRADED and report.firewall[node] == "missing"
    assert all(row.ok for row in report.rows)  # the containers are fine; the node is open
    (note,) = [n for n in report.notes if n.startswith("firewall:")]
    assert note == (
        f"firewall: table inet kimipd_31000 is missing on {node}, so any host reaches every port "
        "there; put it back: pulumi up --replace 'urn:pulumi:loopback::kimipd::kimipd:cluster:"
        "Cluster$kimipd:node:Node$kimipd:firewall:NodeFirewall$command:remote:Command::node-"
        f"{node.replace('.', '-')}-nftables'")
    assert report.as_json()["firewall"][node] == "missing"


def test_a_firewall_that_is_off_is_not_checked(cluster: LoopbackCluster) -> None:
    nodes = LocalNodes(cluster.containers(), without_firewall=set(cluster.outputs()["nodes"]))
    report = status(cluster, nodes)
    assert report.exit_code == OK and report.firewall == {}
    assert not [command for _, command in nodes.commands if command.startswith("nft")]


def test_a_killed_decode_rank_shows_in_its_row_and_exits_1(cluster: LoopbackCluster) -> None:
    victim = cluster.decode.procs[1]
    victim.popen.kill()
    victim.popen.wait(timeout=10)
    report = status(cluster)
    assert report.exit_code == DEGRADED
    dead = rows(report)["decode-r1"]
    assert dead.docker.state == "exited" and dead.docker.exit_code == 137
    assert dead.problems[0] == "exited (exit 137)"
    assert "health connection refused" in dead.problems
    # its group broke with it: rank 0 unhealthy, the whole path fails
    assert rows(report)["decode-r0"].health.status == 503
    assert not report.path.ok
    assert rows(report)["prefill-r0"].ok and rows(report)["router"].ok
    text = _text(report)
    assert "exited (137)" in text and "degraded" in text


def test_a_unit_that_runs_and_does_not_answer_is_named_hung_since_reconcile_saw_it(
        tmp_path, capsys, monkeypatch) -> None:
    """Distinct from an exited unit: its containers run and it answers nothing (a rank frozen,
    as `docker pause` freezes it, stalls its group: sim/standin's group.py); since when, from
    reconcile's state."""
    hung_env = {"SGLANG_STANDIN_STEP_TIMEOUT_SECONDS": "1", "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    cluster = start_cluster(tmp_path / "cluster", decode_env=hung_env)
    frozen = cluster.decode.procs[1].popen
    try:
        argv = cli_with_reconcile_state(cluster, tmp_path, monkeypatch, {
            "units": {"decode": {"broken_since": 1_800_000_000.0}}})
        frozen.send_signal(signal.SIGSTOP)
        nodes = LocalNodes(cluster.containers())
        # The whole path's probe waits on the stalled group: bounded here, as an operator may.
        probes = ["--timeout", "3", "--generate-timeout", "3"]
        assert main(argv + ["status", "--json", *probes],
                    transport_factory=lambda access: nodes) != OK
        document = json.loads(capsys.readouterr().out)
        assert document["hungUnits"] == [{
            "unit": "decode", "containers": ["kimipd-decode-r0@127.0.0.3",
                                             "kimipd-decode-r1@127.0.0.4"],
            "since": "2027-01-15T08:00:00+00:00"}], document["containers"]
        assert main(argv + ["status", *probes], transport_factory=lambda access: nodes) != OK
        assert "decode hung since 08:00:00 UTC: running, not answering" in \
            capsys.readouterr().out
    finally:
        frozen.send_signal(signal.SIGCONT)
        stop_cluster(cluster)


def test_a_groups_rank0_is_given_as_long_as_sglang_gives_its_health_and_others_the_timeout(
        ) -> None:
    """SGLang's /health answers late while its scheduler is busy and 503 only after
    SGLANG_HEALTH_CHECK_TIMEOUT: status gives each group's rank 0 that (from the group's env, in
    the outputs) and a margin, every other container --timeout."""
    from copy import deepcopy

    from ops.status import health_timeout
    from tests.conftest import stack_values
    from tests.outputs import program_outputs

    values = deepcopy(stack_values("sim"))
    values["groups"]["decode"]["env"] = {"SGLANG_HEALTH_CHECK_TIMEOUT": "60"}
    topology = Topology.from_outputs("sim", program_outputs("sim", values))
    timeouts = {(ref.group, ref.rank): health_timeout(topology, ref, 5.0)
                for ref in topology.containers if ref.group is not None}
    assert timeouts[("prefill", 0)] == 25.0  # 1 s + 20 s + 4 s
    assert timeouts[("decode", 0)] == 65.0
    assert timeouts[("prefill", 1)] == timeouts[("decode", 1)] == 5.0  # a dummy health server
    master = next(ref for ref in topology.containers if ref.group is None)
    assert health_timeout(topology, master, 5.0) == 5.0
