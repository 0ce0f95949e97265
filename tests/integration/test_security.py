"""A stranger on the sim's network, through the real engine: a host of this test's own making (its
own network namespace on the sim's bridge, an address that is no node, no key) probes every port
every node of the stack listens on, the ports picked at run time included.

Without the program's firewall and keys (MiniLB, `firewall.enabled: false`: how stacks ran before)
it reaches the servers' admin routes; with stack `sim` as shipped (1P1D, keyed rust router,
firewall) it reaches SSH and the door, which answers only with the key. The key is on no command
line, in no `docker inspect`, in no log and not in plain state; a rule the program did not create
survives its up and destroy. The stacks are small (engine.small_values, nodes 9-12), beside the
8-node modules; the door on two nodes is probed on the shared 2P2D stack (test_door.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from bench.load import Load
from components.render import key_digest
from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    ROUTER_API_KEY, Events, container_ids, env, kimipd, new_stack, project, small_sim,
    small_values, with_minilb)
from tests.integration.sim import SMALL_NODES, SimCluster
from tests.integration.stranger import (
    SMALL_STRANGER, assert_only_ssh_and_the_door, node_ns, probe_every_port, reachable,
    stranger_namespace)

pytestmark = pytest.mark.timeout(1800)

NODES = SMALL_NODES
PREFILL_RANK0, PEER, ROUTER_NODE, DECODE_PEER = SMALL_NODES  # the Mooncake master on the first
ROUTER_PORT = 31000
TABLE = "kimipd_31000"

# A server on a port the kernel picks, accepting for as long as the test needs it.
RUNTIME_LISTENER = textwrap.dedent('''
    import socket, sys
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    print(server.getsockname()[1], flush=True)
    server.settimeout(300)
    while True:
        try:
            server.accept()[0].close()
        except OSError:
            sys.exit(0)
''')


@pytest.fixture(scope="module")
def stranger(sim: SimCluster) -> Iterator[str]:
    with stranger_namespace(SMALL_STRANGER) as address:
        yield address


def probe_nodes(what: str) -> dict[tuple[str, int], list]:
    return probe_every_port(SMALL_STRANGER, NODES, ROUTER_API_KEY, what)


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    # A rule of the operator's own on a node, which the program must leave alone.
    sim.ssh(PEER, "nft add table inet operator_rules && nft add chain inet "
            "operator_rules input '{ type filter hook input priority 0; policy accept; }' && "
            "nft add rule inet operator_rules input tcp dport 9999 counter accept")
    values = with_minilb(small_values(sim))
    values["firewall"] = {"enabled": False}
    stack = new_stack(project, sim, "security", values)
    yield stack
    stack.destroy()
    sim.ssh(PEER, "nft delete table inet operator_rules")


def test_without_firewall_and_keys_a_stranger_reaches_the_servers(
        stack: auto.Stack, stranger: str) -> None:
    """How stacks ran before: the probe finds the servers' admin routes open (this is also what
    shows the probe can see an open port)."""
    stack.up()
    results = probe_nodes("without firewall and keys (MiniLB)")
    rank0 = results[(PREFILL_RANK0, 30000)]
    assert rank0[0] == "open" and rank0[1] == "200", rank0  # POST /flush_cache, no key
    assert results[(PREFILL_RANK0, 8998)][0] == "open"  # prefill's bootstrap server
    assert results[(PREFILL_RANK0, 50051)][0] == "open"  # the Mooncake master's RPC
    assert results[(PREFILL_RANK0, 8998)][2][0] == "200"  # a forged PUT /route, accepted
    door = results[(ROUTER_NODE, ROUTER_PORT)]
    assert door[2][2] == "200", door  # MiniLB: /generate without a key
    assert len(reachable(results)) > len(NODES) + 5


def assert_only_ssh_and_the_router(results: dict[tuple[str, int], list]) -> None:
    assert_only_ssh_and_the_door(results, NODES, (ROUTER_NODE,), ROUTER_PORT)


def test_1p1d_as_shipped_answers_a_stranger_only_at_the_door(
        stack: auto.Stack, project: Project, sim: SimCluster, stranger: str) -> None:
    values = small_values(sim)
    project.write_stack("security", values)
    # What the firewall will apply is in the preview: each node's table, the command's stdin.
    planned: dict[str, str] = {}

    def record(event: auto.EngineEvent) -> None:
        pre = event.resource_pre_event
        if pre is not None and pre.metadata.urn.endswith("-nftables") and pre.metadata.new:
            planned[pre.metadata.urn.rsplit("::", 1)[-1]] = pre.metadata.new.inputs["stdin"]

    preview = stack.preview(diff=True, on_event=record)
    shown = [line for line in preview.stdout.splitlines()
             if "stdin" in line and "any other TCP: reset" in line]
    print(f"preview --diff: {len(planned)} tables planned, shown as:\n  {shown[0].strip()}")
    assert len(shown) == len(NODES), preview.stdout[-3000:]
    assert sorted(planned) == sorted(f"node-{n.replace('.', '-')}-nftables" for n in NODES)
    assert all(f"table inet {TABLE} {{" in rules and "reject with tcp reset" in rules
               for rules in planned.values()), planned
    stack.up()
    # A port picked at run time, as NCCL's or the KV transfer's: any port, on a prefill peer.
    listener = subprocess.Popen(
        ["nsenter", f"--net={node_ns(PEER)}", sys.executable, "-c", RUNTIME_LISTENER],
        stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        runtime_port = int(listener.stdout.readline())
        results = probe_nodes("stack sim as shipped (1P1D, keyed rust router, firewall)")
        assert (PEER, runtime_port) in results
        # ...which a member still reaches (a decode node dials it):
        dial = sim.ssh(DECODE_PEER, f"exec 3<>/dev/tcp/{PEER}/{runtime_port} && echo open")
        assert dial.stdout.strip() == "open", dial.stderr
    finally:
        listener.kill()
        listener.wait()
    print(f"  ({PEER}:{runtime_port}: a listener on a port picked at run time)")
    assert len(results) > len(NODES) + 5  # the servers listen as before; only the table differs
    assert_only_ssh_and_the_router(results)
    # The operator's own table is still there, rule and all.
    listed = sim.ssh(PEER, "nft list table inet operator_rules")
    assert "tcp dport 9999 counter" in listed.stdout, listed.stdout + listed.stderr


def test_a_monitoring_host_reaches_the_metrics_ports_and_the_tables_change_in_place(
        stack: auto.Stack, project: Project, sim: SimCluster, stranger: str) -> None:
    """The stranger made a monitoring host: every table is updated in place (no container, no
    gap without a table), and it reaches each node's metrics ports, whose servers still want the
    key for anything but /health and /metrics."""
    before = container_ids(sim)
    project.update_stack("security", {"firewall": {"operatorHosts": ["10.231.60.254"],
                                                   "monitoringHosts": [stranger]}})
    events = Events()
    stack.up(on_event=events)
    ops = {urn.rsplit("::", 1)[-1]: op for phase, op, urn in events.steps
           if phase == "pre" and op != "same" and "pulumi:pulumi:Stack" not in urn}
    print(f"monitoringHosts added: {ops}")
    assert ops == {f"node-{n.replace('.', '-')}-nftables": "update" for n in NODES}, ops
    assert container_ids(sim) == before
    results = probe_nodes("the stranger as a monitoring host")
    metrics = ({(node, 30000) for node in NODES} | {(PREFILL_RANK0, 9003)}
               | {(ROUTER_NODE, port) for port in (29001, 29002, 29100)})  # the slots, the door
    expected = {(node, 22) for node in NODES} | {(ROUTER_NODE, ROUTER_PORT)} | metrics
    assert reachable(results) == expected, sorted(reachable(results) ^ expected)
    rank0 = results[(PREFILL_RANK0, 30000)]
    assert rank0[1] == "401", rank0  # /flush_cache still wants the key


def test_the_key_is_on_no_command_line_in_no_inspect_or_log_and_not_in_plain_state(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    output: list[str] = []
    stack.up(on_output=output.append)
    # Each node's table lists every member.
    table = sim.ssh(DECODE_PEER, f"nft list table inet {TABLE}").stdout
    assert all(node in table for node in NODES), table
    # The key: on no process's command line on this machine (every node's containers run here).
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert ROUTER_API_KEY.encode() not in cmdline.read_bytes(), cmdline
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    for node in NODES:
        for name in sim.docker(node, "ps", "-q", "--filter", "label=kimipd.role").stdout.split():
            inspect = sim.docker(node, "inspect", name)
            assert inspect.returncode == 0 and ROUTER_API_KEY not in inspect.stdout, (node, name)
            logs = sim.docker(node, "logs", name)
            assert ROUTER_API_KEY not in logs.stdout + logs.stderr, (node, name)
        key_file = sim.ssh(node, "stat -c '%a %U' /opt/kimipd/keys-31000/sglang.yaml")
        assert key_file.stdout.strip() == "600 root", (node, key_file.stdout, key_file.stderr)
    assert ROUTER_API_KEY not in "".join(output)
    # Plain state: the backend's files as they are on disk (the Automation API's export shows
    # secrets decrypted).
    state_files = [path for path in project.state.rglob("*") if path.is_file()]
    assert state_files
    for path in state_files:
        assert ROUTER_API_KEY.encode() not in path.read_bytes(), path


ALICE, BOB = "kimipd-test-client-alice-" + "a" * 24, "kimipd-test-client-bob-" + "b" * 24


def set_client_keys(project: Project, keys: dict[str, str]) -> None:
    """router.door.clientKeys of stack security: each key's digest, by the client's name."""
    document = yaml.safe_load((project.directory / "Pulumi.security.yaml").read_text())
    router = document["config"]["kimipd:router"]
    router["door"]["clientKeys"] = {name: key_digest(key) for name, key in keys.items()}
    project.update_stack("security", {"router": router})


def test_client_keys_are_added_and_revoked_at_the_door_with_no_failed_request(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    """router.door.clientKeys turned on, a key added, another revoked, each one `up` under load
    through the door: no container replaced, no request with a valid key failed, the revoked key
    refused at the door, the keys in no argv, inspect, log or plain state."""
    url = f"http://{ROUTER_NODE}:{ROUTER_PORT}"
    before = container_ids(sim)
    changed: list[set[str]] = []
    # The program's own key (routerApiKey) sends all along: the door names it kimipd.
    with Load(5.0, url, ROUTER_API_KEY, tokens=8) as program:
        set_client_keys(project, {"alice": ALICE})
        events = Events()
        stack.up(on_event=events)
        changed.append(events.changed())
        assert (generate_status(ALICE), generate_status(BOB)) == (200, 401)
        # Bob added while alice sends, then alice revoked while bob sends.
        for keys, sender in (({"alice": ALICE, "bob": BOB}, ALICE), ({"bob": BOB}, BOB)):
            set_client_keys(project, keys)
            with Load(5.0, url, sender, tokens=8) as client:
                events = Events()
                stack.up(on_event=events)
            changed.append(events.changed())
            print(f"clientKeys {sorted(keys)}: {client.summary('the client sending')}; "
                  f"changed {sorted(changed[-1])}")
            assert len(client.results) > 10 and client.failed() == [], client.summary(sender)
    print(program.summary("routerApiKey through the door, all along"))
    assert program.failed() == [], program.summary("routerApiKey")
    assert container_ids(sim) == before
    # Turned on: the door's configuration (reloaded) and its keys; then its keys alone.
    assert {"door-config", "door-clients"} <= changed[0], changed
    assert all("door-clients" in step and "door-config" not in step for step in changed[1:])
    assert (generate_status(ALICE), generate_status(BOB), generate_status("no-such-key")) == (
        401, 200, 401)
    # Each client's requests, as status reads them (reconcile exports them).
    report = json.loads(kimipd(project, "security", "status", "--json").stdout)
    counts = report["door"]["clientRequests"][ROUTER_NODE]
    assert counts["bob"] > 10 and counts["kimipd"] > 10, counts
    logs = sim.docker(ROUTER_NODE, "logs", "kimipd-door")
    assert " client=bob" in logs.stdout + logs.stderr
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert all(key.encode() not in cmdline.read_bytes() for key in (ALICE, BOB)), cmdline
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    inspect = sim.docker(ROUTER_NODE, "inspect", "kimipd-door").stdout
    clients_map = sim.ssh(ROUTER_NODE, "cat /opt/kimipd/router-31000/door/clients.map").stdout
    assert key_digest(BOB) in clients_map
    for key in (ALICE, BOB, ROUTER_API_KEY):
        assert key not in inspect + logs.stdout + logs.stderr + clients_map
        for path in (path for path in project.state.rglob("*") if path.is_file()):
            assert key.encode() not in path.read_bytes(), path


def test_status_finds_a_table_someone_deleted_and_its_fix_puts_it_back(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    """`pulumi refresh` cannot see a flushed table (a command has no read); `kimipd status` can,
    and the command it prints puts the table back."""
    sim.ssh(PEER, f"nft delete table inet {TABLE}")
    result = kimipd(project, "security", "status", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["firewall"][PEER] == "missing", report
    (note,) = [n for n in report["notes"] if n.startswith("firewall:")]
    urn = note.split("--replace ", 1)[1].strip("'")
    stack.up(replace=[urn])
    assert sim.ssh(PEER, f"nft list table inet {TABLE}").returncode == 0
    result = kimipd(project, "security", "status", "--json")
    assert result.returncode == 0, result.stdout + result.stderr


def generate_status(key: str) -> int:
    """POST /generate through the door from this machine with KEY; the HTTP status."""
    body = json.dumps({"text": "rotate", "sampling_params": {"max_new_tokens": 2}}).encode()
    request = urllib.request.Request(f"http://{ROUTER_NODE}:{ROUTER_PORT}/generate", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as failure:
        return failure.code


def test_a_rotated_key_replaces_every_key_file_and_the_old_key_stops_working(
        stack: auto.Stack, sim: SimCluster) -> None:
    """docs/security.md, Rotating the key: one `up` restarts the router slots and every SGLang
    rank with the new key; the old one is refused at the door."""
    new_key, admin_key = "kimipd-test-rotated-key", "kimipd-test-admin-key"
    before = container_ids(sim)
    stack.set_config("kimipd:routerApiKey", auto.ConfigValue(value=new_key, secret=True))
    # The admin routes' own key, in the same key files (one restart for both).
    stack.set_config("kimipd:adminApiKey", auto.ConfigValue(value=admin_key, secret=True))
    try:
        events = Events()
        stack.up(on_event=events)
        replaced = {name for name in events.changed() if name.endswith("-sglang-api-key")}
        assert len(replaced) == len(NODES), events.changed()
        after = container_ids(sim)
        # Both router slots and every SGLang rank restarted with it; the Mooncake master, the
        # doors (HAProxy passes the header on to a slot) and keepalived take no key.
        keyless = {name for name in before
                   if name.startswith(("kimipd-mooncake-master", "kimipd-door",
                                       "kimipd-keepalived"))}
        assert set(after) == set(before) and all(after[name] == before[name] for name in keyless)
        assert all(after[name] != before[name] for name in before if name not in keyless)
        assert (generate_status(ROUTER_API_KEY), generate_status(new_key)) == (401, 200)
        key_file = sim.ssh(DECODE_PEER, "cat /opt/kimipd/keys-31000/sglang.yaml")
        assert new_key in key_file.stdout and ROUTER_API_KEY not in key_file.stdout
        # A server's admin route takes the admin key alone, not the key the routers send.
        flush = {key: sim.ssh(PREFILL_RANK0, (
            "curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Authorization: Bearer "
            f"{key}' http://{PREFILL_RANK0}:30000/flush_cache")).stdout.strip()
            for key in (new_key, admin_key)}
        assert flush == {new_key: "401", admin_key: "200"}, flush
        assert generate_status(new_key) == 200  # generation still takes the routers' key
    finally:
        stack.remove_config("kimipd:adminApiKey")
        stack.set_config("kimipd:routerApiKey",
                         auto.ConfigValue(value=ROUTER_API_KEY, secret=True))


def test_destroy_removes_every_table_and_leaves_the_operators(
        stack: auto.Stack, sim: SimCluster) -> None:
    stack.destroy()
    for node in NODES:
        assert sim.ssh(node, f"nft list table inet {TABLE}").returncode != 0, node
    assert sim.ssh(PEER, "nft list table inet operator_rules").returncode == 0
    assert container_ids(sim) == {}

