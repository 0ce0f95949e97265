"""`kimipd status` against the real HAProxy (Debian 12's 2.6 package, as in the door's image) in
front of two fake slots on loopback: its `show stat`, read with python3 through the nodes'
transport, and the slot states the runtime API sets (drain) or its health checks find (DOWN)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import DEGRADED, DOWN, OK
from ops.door import parse_show_stat, runtime_api
from ops.probe import Prober
from ops.topology import Topology
from ops.status import collect
from tests.ops.door_fakes import KEY, ROUTER_NODE, DoorStack
from tests.ops.loopback import free_port, http_status, wait_until

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not Path(HAPROXY).exists(),
                                 reason="haproxy is not installed (apt-get install haproxy)")]


class Haproxy:
    """haproxy -db with the door's shape: frontend door, the exporter's monitor-uri, backend
    slots with slot-a and slot-b checked on /readiness every 100 ms, fall 2 rise 2."""

    def __init__(self, stack: DoorStack) -> None:
        self.directory = tempfile.mkdtemp(prefix="kimipd-haproxy-")  # a short socket path
        self.socket = f"{self.directory}/admin.sock"
        self.port, self.monitor = free_port(ROUTER_NODE), free_port(ROUTER_NODE)
        servers = "\n".join(f"    server slot-{name} {slot.host}:{slot.port} check"
                            for name, slot in stack.slots.items())
        config = Path(self.directory) / "haproxy.cfg"
        config.write_text(f"""\
global
    stats socket {self.socket} mode 600 level admin
    stats timeout 30s
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout check 2s
    retries 3
    option redispatch 1
    retry-on conn-failure
frontend door
    bind {ROUTER_NODE}:{self.port}
    default_backend slots
frontend exporter
    bind {ROUTER_NODE}:{self.monitor}
    monitor-uri /health
backend slots
    balance leastconn
    option httpchk GET /readiness
    http-check expect status 200
    default-server inter 100 fastinter 100 downinter 100 fall 2 rise 2
{servers}
""")
        checked = subprocess.run([HAPROXY, "-c", "-q", "-f", str(config)], capture_output=True,
                                 text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
        self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(config)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://{ROUTER_NODE}:{self.port}"

    def outputs(self, stack: DoorStack) -> dict:
        outputs = stack.outputs()
        outputs["door"] |= {"url": self.url, "adminSocket": self.socket}
        outputs["containers"]["door"]["healthUrl"] = f"http://{ROUTER_NODE}:{self.monitor}/health"
        outputs |= {"routerUrl": self.url, "generateUrl": self.url + "/generate"}
        return outputs

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def door(tmp_path: Path) -> Iterator[tuple[DoorStack, Haproxy]]:
    stack = DoorStack(tmp_path)
    haproxy = Haproxy(stack)
    try:
        wait_until(lambda: http_status(haproxy.url + "/health") == 200, 20, "haproxy serving")
        yield stack, haproxy
    finally:
        haproxy.stop()
        stack.stop()


def states(stack: DoorStack, haproxy: Haproxy) -> dict[str, str]:
    stat = parse_show_stat(runtime_api(stack.nodes(), ROUTER_NODE, haproxy.socket, "show stat",
                                       5.0))
    return {name: stat[("slots", f"slot-{name}")]["status"] for name in stack.slots}


def status(stack: DoorStack, haproxy: Haproxy):
    nodes = stack.nodes()
    return collect(Topology.from_outputs("door", haproxy.outputs(stack)), nodes,
                   Prober(nodes, 3.0), 3.0, generate_timeout=10, api_key=KEY,
                   router_kind="rust")


def test_status_reads_the_real_haproxy(door: tuple[DoorStack, Haproxy]) -> None:
    stack, haproxy = door
    wait_until(lambda: states(stack, haproxy) == {"a": "UP", "b": "UP"}, 20, "both slots UP")
    report = status(stack, haproxy)
    assert report.exit_code == OK, (report.path,
                                    report.door)
    assert [(s.name, s.at_door, s.check) for s in report.door.slots] == [
        ("a", "UP", "L7OK"), ("b", "UP", "L7OK")]
    assert report.path.ok and report.door.answer.status == 200

    # drained through the runtime API, as a rollout does before replacing a slot
    runtime_api(stack.nodes(), ROUTER_NODE, haproxy.socket, "set server slots/slot-b state drain",
                5.0)
    report = status(stack, haproxy)
    assert report.exit_code == DEGRADED
    assert {s.name: s.at_door for s in report.door.slots} == {"a": "UP", "b": "DRAIN"}
    assert report.door.problems == ["slot b does not serve; a carries every request"]

    # the serving slot dies: its checks fail, the door marks it DOWN; b is drained: nothing
    # serves, HAProxy answers 503 itself
    stack.kill_slot("a")
    wait_until(lambda: states(stack, haproxy)["a"] == "DOWN", 20, "slot a DOWN at the door")
    report = status(stack, haproxy)
    assert (report.exit_code, report.verdict) == (DOWN, "down")
    slot_a = report.door.slots[0]
    assert slot_a.at_door == "DOWN" and slot_a.check == "L4CON"
    assert report.door.answer.status == 503

    # b is set ready again: the door serves, degraded while a is down
    runtime_api(stack.nodes(), ROUTER_NODE, haproxy.socket, "set server slots/slot-b state ready",
                5.0)
    report = status(stack, haproxy)
    assert report.exit_code == DEGRADED and [s.name for s in report.door.serving_slots] == ["b"]
    assert report.path.ok
