"""The door's virtual IP as `kimipd status` sees it, with the door on two nodes.

On each door node, over SSH as the door's runtime API is read: whether the address is on the
node's interface (`ip -o -4 addr show dev IFACE`: the kernel's word, which is what ARP answers
from), and keepalived's own state (MASTER, BACKUP, FAULT), from the file its notify FIFO's
reader writes (assets/virtual-ip.sh --notify-fifo; keepalived has no query interface). They
can disagree: a SIGKILLed keepalived leaves the address on its interface and its last state in
the file, so the state counts only while its container runs, and who holds the address is
read, never inferred. The verdict is a pure function of both nodes' answers.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from .probe import settled
from .remote import RemoteError, Transport, run_patiently
from .topology import Door, DoorNode, VirtualIp

# What the notify FIFO's reader writes (keepalived 2.2.7's states for a vrrp_instance; STOP on a
# graceful shutdown).
KEEPALIVED_STATES = ("MASTER", "BACKUP", "FAULT", "STOP")
ABSENT = "absent"  # its container does not run: nothing holds or moves the address there
UNKNOWN = "unknown"  # the node did not answer, or the file says nothing keepalived writes


def address_command(interface: str) -> str:
    return shlex.join(["ip", "-o", "-4", "addr", "show", "dev", interface])


def state_command(state_file: str) -> str:
    return shlex.join(["cat", state_file])


def holds_address(ip_output: str, address: str) -> bool:
    """Whether `ip -o -4 addr show` lists ADDRESS (`2: bond1    inet 10.0.0.9/32 scope ...`)."""
    for line in ip_output.splitlines():
        words = line.split()
        for word, following in zip(words, words[1:], strict=False):
            if word == "inet" and following.split("/")[0] == address:
                return True
    return False


def keepalived_state(container: str, state_text: str | None) -> str:
    """keepalived's state on a node: its own word (MASTER, BACKUP, FAULT, STOP) while its
    container runs; `absent` when the container does not run (a killed keepalived leaves its
    last state in the file); `unknown` when the node did not answer or the file says nothing
    keepalived writes (not yet written: keepalived notifies at its first transition)."""
    if container == UNKNOWN:
        return UNKNOWN
    if container != "running":
        return ABSENT
    state = (state_text or "").strip()
    return state if state in KEEPALIVED_STATES else UNKNOWN


@dataclass
class VipNode:
    """One door node as status found it."""

    address: str
    door: str  # the door's container state there
    keepalived_container: str  # keepalived's container state there
    keepalived: str  # MASTER, BACKUP, FAULT, STOP, absent, unknown
    holds: bool | None  # the address is on its interface; None: could not be read
    error: str | None = None  # why it could not be read

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VirtualIpReport:
    address: str
    interface: str
    nodes: list[VipNode]
    holders: list[str]
    # Why no request can be trusted to get in (split brain, no holder); None: one holds it.
    down: str | None = None
    problems: list[str] = field(default_factory=list)
    # The door node taken out, if one is: not asked (the other carries the address alone).
    nodes_out: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.down is None and not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"address": self.address, "interface": self.interface, "holders": self.holders,
                "down": self.down, "problems": self.problems,
                "nodes": [node.as_json() for node in self.nodes], "nodesOut": self.nodes_out}


def holders_verdict(address: str, nodes: Sequence[VipNode]) -> tuple[str | None, list[str]]:
    """(why the virtual IP is down, or None; the other problems). Down: both nodes hold it
    (split brain: each answers ARP, so clients follow whichever answered last and requests land
    on both) or, both nodes having answered, neither does (nothing answers the address). A node
    that did not answer may hold it: then no holder among the rest is a problem, not down (the
    door's own GET through the address says whether requests get in)."""
    holders = [node.address for node in nodes if node.holds]
    unread = [node for node in nodes if node.holds is None]
    if len(holders) > 1:
        return (f"split brain: {' and '.join(holders)} both hold the virtual IP {address}; "
                "clients reach whichever answered ARP last. VRRP between the door nodes does "
                "not pass (their link, or the firewall's VRRP rule)", [])
    if not holders and not unread:
        return (f"no door node holds the virtual IP {address}: no request gets in "
                "(both keepalived " + ", ".join(node.keepalived for node in nodes) + ")", [])
    problems = []
    if not holders:
        problems.append(f"no door node that answered holds the virtual IP {address}; "
                        + "; ".join(f"{node.address} did not say ({node.error})"
                                    for node in unread))
    return None, problems


def node_problems(address: str, interface: str, node: VipNode) -> list[str]:
    """What is wrong on one door node, whoever holds the address."""
    where = f"keepalived on {node.address}"
    if node.keepalived == ABSENT:
        if node.holds:
            return [f"{node.address} holds {address} with no keepalived running "
                    f"({node.keepalived_container}): nothing gives it up if its door dies"]
        return [f"{where} is not running ({node.keepalived_container}): the address cannot "
                "move there"]
    if node.keepalived == UNKNOWN:
        return [] if node.holds is None else [f"{where}: its state is unknown"]
    if node.keepalived == "FAULT":
        return [f"{where} is FAULT (its door does not answer /health, or {interface} is "
                "down): it cannot take the address"]
    if node.holds and node.keepalived != "MASTER":
        return [f"{node.address} holds {address} but its keepalived says {node.keepalived}"]
    if node.holds is False and node.keepalived == "MASTER":
        return [f"{where} says MASTER but {address} is not on {interface}"]
    return []


def virtual_ip_report(vip: VirtualIp, nodes: list[VipNode],
                      nodes_out: Sequence[str] = ()) -> VirtualIpReport:
    down, problems = holders_verdict(vip.address, nodes)
    for node in nodes:
        problems += node_problems(vip.address, vip.interface, node)
    return VirtualIpReport(vip.address, vip.interface, nodes,
                           [node.address for node in nodes if node.holds], down, problems,
                           list(nodes_out))


def virtual_ip_families(stack: str, report: VirtualIpReport | None) -> list[Metric]:
    """What status saw of the virtual IP, for reconcile's metrics (its --metrics-file, read by
    node_exporter's textfile collector): nothing exports it otherwise (HAProxy's exporter
    does not know the address, and keepalived 2.2.7 exports only SNMP). A node whose holding
    could not be read has no sample, so the alerts' sums count only what was seen."""
    if report is None:
        return []
    held = GaugeMetricFamily(
        "kimipd_virtual_ip_held",
        "1 while the door's virtual IP is on this door node's interface (ip addr), else 0.",
        labels=["stack", "node", "address"])
    state = GaugeMetricFamily(
        "kimipd_keepalived_state",
        "1 for keepalived's state on this door node: MASTER, BACKUP, FAULT, STOP, absent (its "
        "container does not run) or unknown.",
        labels=["stack", "node", "state"])
    for node in report.nodes:
        if node.holds is not None:
            held.add_metric([stack, node.address, report.address], 1 if node.holds else 0)
        state.add_metric([stack, node.address, node.keepalived], 1)
    return [held, state]


class VirtualIpProbes:
    """Each door node's address and keepalived state, submitted to the status's pool."""

    def __init__(self, door: Door, transport: Transport, timeout: float) -> None:
        if door.virtual_ip is None:
            raise ValueError("the door has no virtual IP")
        self.vip = door.virtual_ip
        self.nodes = door.nodes
        self.nodes_out = door.nodes_out
        self.transport = transport
        self.timeout = timeout
        self.addresses: dict[str, Future] = {}
        self.states: dict[str, Future] = {}

    def submit(self, pool: ThreadPoolExecutor) -> list[Future]:
        self.addresses = {node.address: pool.submit(self._run, node.address,
                                                    address_command(self.vip.interface))
                          for node in self.nodes}
        self.states = {node.address: pool.submit(self._run, node.address,
                                                 state_command(node.state_file))
                       for node in self.nodes}
        return [*self.addresses.values(), *self.states.values()]

    def _run(self, node: str, command: str) -> tuple[str | None, str | None]:
        """(stdout, None) or (None, why not)."""
        try:
            result = run_patiently(self.transport, node, command, self.timeout)
        except RemoteError as error:
            return None, str(error)
        if result.status != 0:
            return None, result.failure
        return result.out, None

    def report(self, containers: Mapping[str, str]) -> VirtualIpReport:
        """CONTAINERS: role -> docker state, from the status's rows."""
        return virtual_ip_report(self.vip, [self._node(node, containers) for node in self.nodes],
                                 self.nodes_out)

    def _node(self, node: DoorNode, containers: Mapping[str, str]) -> VipNode:
        timed_out = (None, "did not answer in time")
        ip_out, ip_error = settled(self.addresses.get(node.address), timed_out)
        state_out, _ = settled(self.states.get(node.address), timed_out)
        container = containers.get(node.keepalived_role, UNKNOWN)
        return VipNode(node.address, containers.get(node.door_role, UNKNOWN), container,
                       keepalived_state(container, state_out),
                       holds_address(ip_out, self.vip.address) if ip_out is not None else None,
                       ip_error)
