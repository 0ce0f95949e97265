"""A test's fake HTTP server on loopback, served on a thread and stopped within a bounded time."""

from __future__ import annotations

import socketserver
import threading

STOP_SECONDS = 10.0


def serve(server: socketserver.BaseServer) -> threading.Thread:
    """SERVER's serve_forever on a daemon thread (polling every 0.05 s, so a stop is quick)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return thread


def stop(server: socketserver.BaseServer, seconds: float = STOP_SECONDS) -> None:
    """SERVER's port closed, whether or not its loop said it ended within SECONDS.

    socketserver's shutdown() waits without a bound for serve_forever to say it ended; in CI one
    such wait outlasted pytest's timeout in a test's teardown (tests/ops/door_fakes.py, 4352f3f).
    """
    stopping = threading.Thread(target=server.shutdown, daemon=True)
    stopping.start()
    stopping.join(seconds)
    server.server_close()  # the port refuses connections from now on
