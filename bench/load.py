"""A bounded open-loop load on a router's /generate, shared by the benches (B6, B7) and the engine
tests (tests/integration/engine.py): RATE requests per second, each on a thread of its own, sent
on the clock whatever the answers; every other one streamed when asked (`"stream": true`, read to
`data: [DONE]`).

Each request goes out in one segment: headers and body in one `sendall`, the answer parsed by
http.client. urllib writes the headers and the body separately, and the second write waited for
the server's delayed ACK (~40 ms) on every request, which is what a latency figure then measured.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Answer:
    """One request: when it was sent and answered (time.monotonic()), and what came back."""

    sent: float
    done: float
    streamed: bool
    status: int  # 0: no HTTP answer
    # Why it is not a whole answer despite its status: refused, reset, closed, timeout, cut
    # (the body broke off), incomplete (a stream without `data: [DONE]`, an answer without
    # text), or the exception's name; "" when nothing went wrong on the wire.
    error: str = ""
    # The sim's oracle (sim/standin/sglang_standin/contract.py): the decode that answered got KV
    # from a prefill of another KV contract and marked its answer. Real SGLang would not say so;
    # its text would be silently wrong.
    mixed: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def seconds(self) -> float:
        return self.done - self.sent

    @property
    def outcome(self) -> str:
        """`ok`, the HTTP status of a refusal (`503`), or the error."""
        if self.ok:
            return "ok"
        return str(self.status) if self.status not in (0, 200) else self.error or "no answer"


def error_kind(error: BaseException) -> str:
    # RemoteDisconnected is a ConnectionResetError: the server closed before any status line.
    if isinstance(error, http.client.RemoteDisconnected):
        return "closed"
    if isinstance(error, ConnectionRefusedError):
        return "refused"
    if isinstance(error, (ConnectionResetError, BrokenPipeError)):
        return "reset"
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, http.client.IncompleteRead):
        return "cut"
    return type(error).__name__


def request_bytes(url: str, path: str, body: bytes, api_key: str | None) -> bytes:
    """A POST of BODY (JSON) to URL's PATH, headers and body in one buffer."""
    parts = urlsplit(url)
    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}",
             "Content-Type: application/json", f"Content-Length: {len(body)}",
             "Connection: close"]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def generate(url: str, api_key: str | None, tokens: int, streamed: bool,
             timeout: float = 60.0) -> Answer:
    """One /generate at URL (plain HTTP), sent in one segment, read to its end."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"{url}: the load speaks plain HTTP to a host (http://HOST:PORT)")
    body = json.dumps({"text": "load", "stream": streamed,
                       "sampling_params": {"max_new_tokens": tokens}}).encode()
    sent, status, error = time.monotonic(), 0, ""
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request_bytes(url, "/generate", body, api_key))
            response = http.client.HTTPResponse(sock, method="POST")
            try:
                response.begin()
                status = response.status
                text = response.read().decode(errors="replace")
            finally:
                response.close()
        if status == 200 and not ("data: [DONE]" in text if streamed else '"text"' in text):
            error = "incomplete"
        mixed = status == 200 and MIXED_MARK in text
    except (OSError, http.client.HTTPException) as failure:
        error, mixed = error_kind(failure), False
    return Answer(sent, time.monotonic(), streamed, status, error, mixed)


# The key a decode stand-in adds to its answer's meta_info when the KV came from a prefill of
# another contract.
MIXED_MARK = '"kv_contract_mismatch"'


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


class Load:
    """RATE requests per second to URL's /generate until stopped, each asking TOKENS tokens;
    with STREAMS every other one is streamed. `answers` fills as they end."""

    def __init__(self, rate: float, url: str, api_key: str | None, tokens: int = 26,
                 streams: bool = True, timeout: float = 60.0) -> None:
        self.rate, self.url, self.api_key = rate, url, api_key
        self.tokens, self.streams, self.timeout = tokens, streams, timeout
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._clock = threading.Thread(target=self._run, daemon=True)

    def _one(self, streamed: bool) -> None:
        answer = generate(self.url, self.api_key, self.tokens, streamed, self.timeout)
        with self._lock:
            self.answers.append(answer)

    def _run(self) -> None:
        interval, next_at, count = 1.0 / self.rate, time.monotonic(), 0
        while not self._stop.is_set():
            streamed = self.streams and count % 2 == 1
            thread = threading.Thread(target=self._one, args=(streamed,), daemon=True)
            thread.start()
            self._threads.append(thread)
            count += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    @property
    def results(self) -> list[Answer]:
        """The answers in the order they were sent."""
        with self._lock:
            return sorted(self.answers, key=lambda answer: answer.sent)

    def failed(self, since: float = 0.0) -> list[Answer]:
        """Those sent at SINCE or later that got no whole answer (a stream cut under its 200
        is a failure)."""
        return [answer for answer in self.results if answer.sent >= since and not answer.ok]

    def mixed(self) -> list[Answer]:
        """The answers a decode marked as made from another contract's KV (Answer.mixed)."""
        return [answer for answer in self.results if answer.mixed]

    def summary(self, what: str) -> str:
        outcomes = Counter(answer.outcome for answer in self.failed())
        streamed = " (half streamed)" if self.streams else ""
        mixed = f", {len(self.mixed())} of mixed KV contracts" if self.mixed() else ""
        return (f"{what}: {len(self.answers)} requests{streamed}, {len(self.failed())} failed "
                f"{dict(outcomes) or ''}").rstrip() + mixed

    def __enter__(self) -> Load:
        self._clock.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._clock.join()
        for thread in self._threads:
            thread.join(self.timeout + 30)
