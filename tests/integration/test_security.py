"""A stranger on the sim's network, through the real engine: a host of this test's own making (its
own network namespace on the sim's bridge, an address that is no node, no key) probes every port
every sim node listens on, the ports picked at run time included.

Without the program's firewall and keys (MiniLB, `firewall.enabled: false`: how stacks ran before)
it reaches the servers' admin routes; with stack `sim` as shipped (1P1D, keyed rust router,
firewall) and then `sim-2p2d` it reaches SSH and the door (on both door nodes there), which
answers only with the key. The key is on no command line, in no `docker inspect`, in no log and
not in plain state; a rule the program did not create survives its up and destroy.
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
from pulumi import automation as auto

from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    NODES, ROUTER_API_KEY, Events, container_ids, env, kimipd, new_stack, project, sim,
    sim_values, with_minilb)
from tests.integration.sim import SimCluster
from tests.integration.stranger import STRANGER, STRANGER_NS, stranger_namespace

pytestmark = pytest.mark.timeout(1800)

ROUTER_NODE, ROUTER_PORT = "10.231.60.5", 31000
TABLE = "kimipd_31000"

# Run inside the stranger's namespace: connect to each target; where something answers, ask it an
# admin route with no key (what a stranger would try first), and the door for /generate.
PROBE = textwrap.dedent('''
    import json, socket, sys
    targets, key = json.load(sys.stdin)
    def http(host, port, method, path, headers=""):
        body = {"/generate": '{"text": "hi", "sampling_params": {"max_new_tokens": 2}}',
                # a registration no real rank has (node rank 99) pointing at the stranger
                "/route": '{"role": "Prefill", "node_rank": 99, "rank_ip": "10.231.60.200", '
                          '"rank_port": 1}'}.get(path, "")
        request = (f"{method} {path} HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n"
                   f"Content-Type: application/json\\r\\nContent-Length: {len(body)}\\r\\n"
                   f"{headers}\\r\\n{body}")
        with socket.create_connection((host, port), timeout=3) as conn:
            conn.settimeout(3)
            conn.sendall(request.encode())
            line = conn.recv(64).split(b"\\r\\n")[0].decode(errors="replace")
        return line.split()[1] if line.startswith("HTTP/") else "no-http"
    results = []
    for host, port in targets:
        try:
            socket.create_connection((host, port), timeout=2).close()
        except ConnectionRefusedError:
            results.append([host, port, "refused", None, None]); continue
        except OSError as error:
            results.append([host, port, type(error).__name__, None, None]); continue
        if port == 22:
            results.append([host, port, "open", "ssh", None]); continue
        answers = []
        # an admin route, a forged bootstrap route, metrics, then the door's /generate
        for method, path, headers in (("POST", "/flush_cache", ""), ("PUT", "/route", ""),
                                      ("GET", "/metrics", ""), ("POST", "/generate", ""),
                                      ("POST", "/generate",
                                       f"Authorization: Bearer {key}\\r\\n")):
            try:
                answers.append(http(host, port, method, path, headers))
            except OSError as error:
                answers.append(type(error).__name__)
        results.append([host, port, "open", answers[0], answers[1:]])
    json.dump(results, sys.stdout)
''')


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


def node_ns(address: str) -> str:
    return f"/var/run/netns/kpd-node{address.rsplit('.', 1)[1]}"


def listening_ports(address: str) -> list[int]:
    """Every TCP port the node listens on for other hosts (not loopback only)."""
    out = subprocess.run(["nsenter", f"--net={node_ns(address)}", "ss", "-Hltn"],
                         capture_output=True, text=True, check=True).stdout
    ports = set()
    for line in out.splitlines():
        local = line.split()[3]
        host, _, port = local.rpartition(":")
        if host.strip("[]").startswith(("127.", "::1")):
            continue
        ports.add(int(port))
    return sorted(ports)


@pytest.fixture(scope="module")
def stranger(sim: SimCluster) -> Iterator[str]:
    with stranger_namespace() as address:
        yield address


def probe(targets: list[tuple[str, int]]) -> list[list]:
    result = subprocess.run(
        ["nsenter", f"--net=/var/run/netns/{STRANGER_NS}", sys.executable, "-c", PROBE],
        input=json.dumps([targets, ROUTER_API_KEY]), capture_output=True, text=True,
        timeout=600, check=True)
    return json.loads(result.stdout)


def probe_every_port(what: str) -> dict[tuple[str, int], list]:
    targets = [(node, port) for node in NODES for port in listening_ports(node)]
    results = {(host, port): rest for host, port, *rest in probe(targets)}
    print(f"\n{what}: the stranger {STRANGER} probed {len(targets)} listening ports")
    print(f"  {'node:port':<20} {'connect':<9} {'POST /flush_cache':<18} "
          "PUT /route, GET /metrics, /generate (no key, key)")
    for (host, port), (connect, admin, others) in sorted(results.items()):
        print(f"  {host + ':' + str(port):<20} {connect:<9} {admin or '-':<18} "
              f"{', '.join(others) if others else '-'}")
    answered = sum(1 for connect, *_ in results.values() if connect == "open")
    print(f"  answered: {answered} of {len(results)}")
    return results


def reachable(results: dict[tuple[str, int], list]) -> set[tuple[str, int]]:
    return {target for target, (connect, *_) in results.items() if connect == "open"}


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    # A rule of the operator's own on node 3, which the program must leave alone.
    sim.ssh("10.231.60.3", "nft add table inet operator_rules && nft add chain inet "
            "operator_rules input '{ type filter hook input priority 0; policy accept; }' && "
            "nft add rule inet operator_rules input tcp dport 9999 counter accept")
    values = with_minilb(sim_values(sim))
    values["firewall"] = {"enabled": False}
    stack = new_stack(project, sim, "security", values)
    yield stack
    stack.destroy()
    sim.ssh("10.231.60.3", "nft delete table inet operator_rules")


def test_without_firewall_and_keys_a_stranger_reaches_the_servers(
        stack: auto.Stack, stranger: str) -> None:
    """How stacks ran before: the probe finds the servers' admin routes open (this is also what
    shows the probe can see an open port)."""
    stack.up()
    results = probe_every_port("without firewall and keys (MiniLB)")
    rank0 = results[("10.231.60.1", 30000)]
    assert rank0[0] == "open" and rank0[1] == "200", rank0  # POST /flush_cache, no key
    assert results[("10.231.60.1", 8998)][0] == "open"  # prefill's bootstrap server
    assert results[("10.231.60.1", 50051)][0] == "open"  # the Mooncake master's RPC
    assert results[("10.231.60.1", 8998)][2][0] == "200"  # a forged PUT /route, accepted
    door = results[(ROUTER_NODE, ROUTER_PORT)]
    assert door[2][2] == "200", door  # MiniLB: /generate without a key
    assert len(reachable(results)) > len(NODES) + 5


def assert_only_ssh_and_the_door(results: dict[tuple[str, int], list],
                                 door_nodes: tuple[str, ...] = (ROUTER_NODE,)) -> None:
    expected = {(node, 22) for node in NODES} | {(node, ROUTER_PORT) for node in door_nodes}
    assert reachable(results) == expected, sorted(reachable(results) ^ expected)
    refused = {target for target, (connect, *_) in results.items() if connect != "open"}
    assert all(results[target][0] == "refused" for target in refused), (
        "the firewall resets a stranger's connection (a tool falls back at once)")
    for node in door_nodes:
        connect, admin, (route, metrics, generate, keyed) = results[(node, ROUTER_PORT)]
        assert (admin, generate, keyed) == ("401", "401", "200"), results[(node, ROUTER_PORT)]


def test_1p1d_as_shipped_answers_a_stranger_only_at_the_door(
        stack: auto.Stack, project: Project, sim: SimCluster, stranger: str) -> None:
    values = sim_values(sim)
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
    # A port picked at run time, as NCCL's or the KV transfer's: any port, on node 6.
    listener = subprocess.Popen(
        ["nsenter", f"--net={node_ns('10.231.60.6')}", sys.executable, "-c", RUNTIME_LISTENER],
        stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        runtime_port = int(listener.stdout.readline())
        results = probe_every_port("stack sim as shipped (1P1D, keyed rust router, firewall)")
        assert ("10.231.60.6", runtime_port) in results
        # ...which a member still reaches (node 7 dials it):
        dial = sim.ssh("10.231.60.7", f"exec 3<>/dev/tcp/10.231.60.6/{runtime_port} && echo open")
        assert dial.stdout.strip() == "open", dial.stderr
    finally:
        listener.kill()
        listener.wait()
    print(f"  (10.231.60.6:{runtime_port}: a listener on a port picked at run time)")
    assert len(results) > len(NODES) + 5  # the servers listen as before; only the table differs
    assert_only_ssh_and_the_door(results)
    # The operator's own table is still there, rule and all.
    listed = sim.ssh("10.231.60.3", "nft list table inet operator_rules")
    assert "tcp dport 9999 counter" in listed.stdout, listed.stdout + listed.stderr


def test_a_monitoring_host_reaches_the_metrics_ports_and_the_tables_change_in_place(
        stack: auto.Stack, project: Project, sim: SimCluster, stranger: str) -> None:
    """The stranger made a monitoring host: every table is updated in place (no container, no
    gap without a table), and it reaches each node's metrics ports, whose servers still want the
    key for anything but /health and /metrics."""
    before = container_ids(sim)
    project.update_stack("security", {"firewall": {"operatorHosts": ["10.231.60.254"],
                                                   "monitoringHosts": [STRANGER]}})
    events = Events()
    stack.up(on_event=events)
    ops = {urn.rsplit("::", 1)[-1]: op for phase, op, urn in events.steps
           if phase == "pre" and op != "same" and "pulumi:pulumi:Stack" not in urn}
    print(f"monitoringHosts added: {ops}")
    assert ops == {f"node-{n.replace('.', '-')}-nftables": "update" for n in NODES}, ops
    assert container_ids(sim) == before
    results = probe_every_port("the stranger as a monitoring host")
    metrics = ({(node, 30000) for node in NODES} | {("10.231.60.1", 9003)}
               | {(ROUTER_NODE, port) for port in (29001, 29002, 29100)})  # the slots, the door
    expected = {(node, 22) for node in NODES} | {(ROUTER_NODE, ROUTER_PORT)} | metrics
    assert reachable(results) == expected, sorted(reachable(results) ^ expected)
    rank0 = results[("10.231.60.1", 30000)]
    assert rank0[1] == "401", rank0  # /flush_cache still wants the key


def test_2p2d_answers_a_stranger_only_at_the_door_and_keeps_the_key_hidden(
        stack: auto.Stack, project: Project, sim: SimCluster, stranger: str) -> None:
    project.write_stack("security", sim_values(sim, "sim-2p2d"))
    output: list[str] = []
    stack.up(on_output=output.append)
    results = probe_every_port("stack sim-2p2d (2P2D, keyed rust router, firewall)")
    # The door on two nodes: either answers on router.port (the virtual IP lands on both).
    assert_only_ssh_and_the_door(results, (ROUTER_NODE, "10.231.60.7"))
    # Each node's table lists every member (updated in place when the groups changed).
    table = sim.ssh("10.231.60.8", f"nft list table inet {TABLE}").stdout
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


def test_status_finds_a_table_someone_deleted_and_its_fix_puts_it_back(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    """`pulumi refresh` cannot see a flushed table (a command has no read); `kimipd status` can,
    and the command it prints puts the table back."""
    sim.ssh("10.231.60.4", f"nft delete table inet {TABLE}")
    result = kimipd(project, "security", "status", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["firewall"]["10.231.60.4"] == "missing", report
    (note,) = [n for n in report["notes"] if n.startswith("firewall:")]
    urn = note.split("--replace ", 1)[1].strip("'")
    stack.up(replace=[urn])
    assert sim.ssh("10.231.60.4", f"nft list table inet {TABLE}").returncode == 0
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
    new_key = "kimipd-test-rotated-key"
    before = container_ids(sim)
    stack.set_config("kimipd:routerApiKey", auto.ConfigValue(value=new_key, secret=True))
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
        key_file = sim.ssh("10.231.60.7", "cat /opt/kimipd/keys-31000/sglang.yaml")
        assert new_key in key_file.stdout and ROUTER_API_KEY not in key_file.stdout
    finally:
        stack.set_config("kimipd:routerApiKey",
                         auto.ConfigValue(value=ROUTER_API_KEY, secret=True))


def test_destroy_removes_every_table_and_leaves_the_operators(
        stack: auto.Stack, sim: SimCluster) -> None:
    stack.destroy()
    for node in NODES:
        assert sim.ssh(node, f"nft list table inet {TABLE}").returncode != 0, node
    assert sim.ssh("10.231.60.3", "nft list table inet operator_rules").returncode == 0
    assert container_ids(sim) == {}

