"""run_patiently: a read-only probe that timed out is asked once more, longer; a node that did
not answer at all is not."""

from __future__ import annotations

import pytest

from ops.probe import STATUS_MARK, Prober
from ops.remote import (SLOW_NODE_FACTOR, CommandTimeout, RemoteError, RemoteResult,
                        run_patiently)


class SlowNode:
    """Answers a command only when given at least NEEDS seconds; records each timeout asked."""

    def __init__(self, needs: float, lost: bool = False, answer: bytes = b"ok\n") -> None:
        self.needs, self.lost, self.answer, self.asked = needs, lost, answer, []

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        self.asked.append(timeout)
        if self.lost:
            raise RemoteError(f"ssh {node}: connection refused")
        if timeout < self.needs:
            raise CommandTimeout(f"ssh {node}: `{command}` did not finish within {timeout:g}s")
        return RemoteResult(node, command, 0, self.answer, b"")

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


CURL_OK = f'{{"status": "ok"}}\n{STATUS_MARK} 200 0.004\n'.encode()


def test_an_http_get_over_ssh_on_a_slow_node_is_asked_once_more() -> None:
    # curl's --max-time bounds the answer itself: an SSH command past it met a slow node.
    node = SlowNode(needs=12, answer=CURL_OK)
    answer = Prober(node, timeout=5, via="ssh").get("http://10.0.0.1:30000/health", "10.0.0.1")
    assert (answer.status, answer.via) == (200, "ssh")
    assert node.asked == [10, 10 * SLOW_NODE_FACTOR]


def test_a_post_over_ssh_is_never_sent_twice() -> None:
    node = SlowNode(needs=12, answer=CURL_OK)
    answer = Prober(node, timeout=5, via="ssh").request(
        "POST", "http://10.0.0.1:8000/generate", "10.0.0.1", body={"text": "hi"})
    assert answer.status is None and "did not finish" in (answer.error or "")
    assert node.asked == [10]
