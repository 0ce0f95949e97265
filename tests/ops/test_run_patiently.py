"""run_patiently: a read-only probe that timed out is asked once more, longer; a node that did
not answer at all is not."""

from __future__ import annotations

import pytest

from ops.remote import (SLOW_NODE_FACTOR, CommandTimeout, RemoteError, RemoteResult,
                        run_patiently)


class SlowNode:
    """Answers a command only when given at least NEEDS seconds; records each timeout asked."""

    def __init__(self, needs: float, lost: bool = False) -> None:
        self.needs, self.lost, self.asked = needs, lost, []

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        self.asked.append(timeout)
        if self.lost:
            raise RemoteError(f"ssh {node}: connection refused")
        if timeout < self.needs:
            raise CommandTimeout(f"ssh {node}: `{command}` did not finish within {timeout:g}s")
        return RemoteResult(node, command, 0, b"ok\n", b"")

    def close(self) -> None:
        pass


def test_a_slow_answer_is_waited_for_once_longer() -> None:
    node = SlowNode(needs=8)
    assert run_patiently(node, "10.0.0.1", "ip -o -4 addr show dev bond1", 5).out == "ok\n"
    assert node.asked == [5, 5 * SLOW_NODE_FACTOR]


def test_slower_than_that_is_still_a_timeout() -> None:
    node = SlowNode(needs=60)
    with pytest.raises(CommandTimeout):
        run_patiently(node, "10.0.0.1", "nft list table inet kimipd", 5)
    assert node.asked == [5, 5 * SLOW_NODE_FACTOR]


def test_a_node_that_does_not_answer_is_not_asked_again() -> None:
    node = SlowNode(needs=0, lost=True)
    with pytest.raises(RemoteError):
        run_patiently(node, "10.0.0.1", "cat /opt/kimipd/router-31000/rollout.json", 5)
    assert node.asked == [5]
