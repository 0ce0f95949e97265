"""A host on the sim's network that is no node: a network namespace of the test's own making on
the sim's bridge, with an address no node has. Every test that plays a stranger uses one of
these two: the 8-node modules `STRANGER`, the small stacks' modules `SMALL_STRANGER`, so that
every engine session (scripts/test) can play one at the same time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tests.integration.sim import SMALL_FROM

BRIDGE = "kpdbr0"


@dataclass(frozen=True)
class Stranger:
    namespace: str
    address: str
    veth: str  # its end on the bridge


STRANGER = Stranger("kimipd-stranger", "10.231.60.200", "kpdstranger")
# One per set of small nodes (tests/integration/sim.py): both small sessions may play one.
SMALL_STRANGER = Stranger(f"kimipd-stranger-s{SMALL_FROM}", f"10.231.60.{188 + SMALL_FROM}",
                          f"kpdstranger-s{SMALL_FROM}")


@contextmanager
def stranger_namespace(stranger: Stranger = STRANGER) -> Iterator[str]:
    """STRANGER's namespace, up for the block and removed after it; yields its address."""
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    namespace, veth = stranger.namespace, stranger.veth
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    subprocess.run(["ip", "link", "del", veth], capture_output=True)
    ip("netns", "add", namespace)
    try:
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("link", "set", veth, "master", BRIDGE, "up")
        ip("-n", namespace, "addr", "add", f"{stranger.address}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        yield stranger.address
    finally:
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


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


def probe(stranger: Stranger, targets: list[tuple[str, int]], key: str) -> list[list]:
    """PROBE run in STRANGER's namespace against TARGETS, /generate keyed with KEY."""
    result = subprocess.run(
        ["nsenter", f"--net=/var/run/netns/{stranger.namespace}", sys.executable, "-c", PROBE],
        input=json.dumps([targets, key]), capture_output=True, text=True,
        timeout=600, check=True)
    return json.loads(result.stdout)


def probe_every_port(stranger: Stranger, nodes: Sequence[str], key: str,
                     what: str) -> dict[tuple[str, int], list]:
    """Every port NODES listen on, probed by STRANGER; printed as a table, keyed by target."""
    targets = [(node, port) for node in nodes for port in listening_ports(node)]
    results = {(host, port): rest for host, port, *rest in probe(stranger, targets, key)}
    print(f"\n{what}: the stranger {stranger.address} probed {len(targets)} listening ports")
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


def assert_only_ssh_and_the_door(results: dict[tuple[str, int], list], nodes: Sequence[str],
                                 door_nodes: Sequence[str], port: int) -> None:
    """What a stranger may reach on NODES: SSH, and PORT (the door) on DOOR_NODES, which
    answers only with the key; anything else is refused at once."""
    expected = {(node, 22) for node in nodes} | {(node, port) for node in door_nodes}
    assert reachable(results) == expected, sorted(reachable(results) ^ expected)
    refused = {target for target, (connect, *_) in results.items() if connect != "open"}
    assert all(results[target][0] == "refused" for target in refused), (
        "the firewall resets a stranger's connection (a tool falls back at once)")
    for node in door_nodes:
        connect, admin, (route, metrics, generate, keyed) = results[(node, port)]
        assert (admin, generate, keyed) == ("401", "401", "200"), results[(node, port)]
