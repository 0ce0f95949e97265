"""The drain's wait for open requests (assets/router_api.py `wait_idle`): a worker that finishes
them is waited for; one whose /health keeps failing (a hung group) is given up after
STUCK_SECONDS of failures in a row, not after the whole drain timeout."""

from __future__ import annotations

import sys
import time

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def router_api():
    sys.path.insert(0, str(REPO / "assets"))
    try:
        import router_api
    finally:
        sys.path.remove(str(REPO / "assets"))
    return router_api


def wait(router_api, monkeypatch, counts, stuck, drain_timeout=30.0, stuck_seconds=0.3):
    said: list[str] = []
    # what the drain prints (kept in the stack's state)
    monkeypatch.setattr(router_api, "log", said.append)
    left = iter(counts)
    started = time.monotonic()
    router_api.wait_idle(lambda: next(left, counts[-1]), drain_timeout, 0.01,
                         lambda n: f"idle {n}", lambda n: f"timeout {n}", stuck=stuck,
                         given_up=lambda n: f"gave up {n}", stuck_seconds=stuck_seconds)
    return said, time.monotonic() - started


def test_a_hung_worker_is_given_up_after_its_health_failed_long_enough(router_api,
                                                                     monkeypatch) -> None:
    said, took = wait(router_api, monkeypatch, [3], stuck=lambda: True)
    assert said == ["gave up 3"]
    assert took < 5, took  # far short of the 30 s drain timeout


def test_a_health_that_recovers_starts_the_count_again_and_idle_still_ends_it(
        router_api, monkeypatch) -> None:
    answers = iter([True] * 5 + [False] + [True] * 5 + [False] * 1000)
    said, _ = wait(router_api, monkeypatch, [2] * 30 + [0], stuck=lambda: next(answers),
                   stuck_seconds=10)
    assert said == ["idle 0"]


def test_a_healthy_busy_worker_is_waited_for_until_the_timeout(router_api, monkeypatch) -> None:
    said, took = wait(router_api, monkeypatch, [1], stuck=lambda: False, drain_timeout=0.5)
    assert said == ["timeout 1"] and took >= 0.5
