"""`kimipd rollout stop` (and `kimipd up`'s Ctrl-C) asks router.node and the other door node:
the other node's door-slots.py waits (its door's drain of a slot) read the record there."""

from __future__ import annotations

import pytest

from ops.remote import RemoteError, RemoteResult
from ops.rollout import stop
from ops.topology import Door, DoorNode

ROUTER_NODE, OTHER = "10.0.0.5", "10.0.0.7"


def door(*addresses: str) -> Door:
    return Door(url=f"http://{ROUTER_NODE}:31000", tls=False, node=ROUTER_NODE,
                admin_socket="/run/kimipd-door/admin.sock", container="kimipd-door", slots=(),
                nodes=tuple(DoorNode(address, "door", "kimipd-door", "keepalived",
                                     "kimipd-keepalived", "/run/kimipd/vrrp-state")
                            for address in addresses),
                state_dir="/opt/kimipd/router-31000")


class Nodes:
    def __init__(self, lost: set[str] = frozenset()) -> None:
        self.lost, self.ran = lost, []

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        if node in self.lost:
            raise RemoteError(f"ssh {node}: connection timed out")
        self.ran.append((node, command))
        return RemoteResult(node, command, 0, b"stop asked: ... (phase converting-a)\n", b"")

    def close(self) -> None:
        pass


def test_both_door_nodes_are_asked_router_node_first() -> None:
    nodes = Nodes()
    said = stop(nodes, door(ROUTER_NODE, OTHER), 5)
    assert [node for node, _ in nodes.ran] == [ROUTER_NODE, OTHER]
    assert all("router-members.py stop --state-dir /opt/kimipd/router-31000" in command
               for _, command in nodes.ran)
    assert said.splitlines()[1].startswith(f"{OTHER}: stop asked")


def test_a_lost_other_door_node_is_named_and_the_stop_stands() -> None:
    said = stop(Nodes(lost={OTHER}), door(ROUTER_NODE, OTHER), 5)
    assert f"{OTHER}: not asked (ssh {OTHER}: connection timed out)" in said


def test_router_node_not_answering_is_the_stops_failure() -> None:
    with pytest.raises(RemoteError):
        stop(Nodes(lost={ROUTER_NODE}), door(ROUTER_NODE, OTHER), 5)


def test_a_door_on_router_node_alone_says_what_it_said() -> None:
    nodes = Nodes()
    assert stop(nodes, door(), 5) == "stop asked: ... (phase converting-a)"
    assert [node for node, _ in nodes.ran] == [ROUTER_NODE]
