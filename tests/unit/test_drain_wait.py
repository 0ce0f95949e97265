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


class SlowHealth:
    """A rank 0 on loopback whose /health answers STATUS after DELAY seconds, as SGLang's does:
    late while its scheduler works through long prefills (busy), 503 once it gave no output for
    SGLANG_HEALTH_CHECK_TIMEOUT (hung)."""

    def __init__(self, delay: float, status: int) -> None:
        import http.server
        import threading

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(outer.delay)
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_) -> None:
                pass

        self.delay, self.status = delay, status
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_busy_rank0_that_answers_health_late_is_healthy_and_a_503_is_not(router_api) -> None:
    """7 s for a 200: busy, not hung (the probe gave 5 s before, and a drain gave up a busy
    group's requests). A 503 is hung however fast it comes; an answer later than the group's
    bound and its margin is no answer."""
    busy, hung = SlowHealth(7.0, 200), SlowHealth(0.0, 503)
    try:
        started = time.monotonic()
        assert router_api.rank0_healthy(busy.url, "")
        assert 7.0 <= time.monotonic() - started < 10.0
        assert not router_api.rank0_healthy(hung.url, "")
        started = time.monotonic()
        assert not router_api.rank0_healthy(busy.url, "", health_seconds=1.0)
        assert time.monotonic() - started < 6.5  # 1 s and the margin, not the 7 s answer
    finally:
        busy.close()
        hung.close()
