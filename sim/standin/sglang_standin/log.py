"""Log lines of the stand-in: timestamped, tagged with the rank, flushed at once."""

from __future__ import annotations

import os
import sys
import threading
import time

_LOCK = threading.RLock()  # re-entrant: the signal handler logs too
_prefix = "standin"


def set_prefix(prefix: str) -> None:
    global _prefix
    _prefix = prefix


def log(msg: str, err: bool = False) -> None:
    line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')} {_prefix}] {msg}"
    with _LOCK:
        stream = sys.stderr if err else sys.stdout
        try:
            print(line, file=stream, flush=True)
        except (BrokenPipeError, ValueError, OSError):
            pass


def die(msg: str, code: int = 1) -> None:
    log(msg, err=True)
    # Called from server, timer and group threads too, where sys.exit would end only the thread:
    # a failed rank takes its whole process down, as a crashed SGLang rank does.
    os._exit(code)
