"""`kimipd verify`: the runbook's step-6 requests through the router, timed token by token.

Each request is SGLang's native `/generate` with `input_ids` (exactly the shape's input length),
`sampling_params: {max_new_tokens: N, ignore_eos: true}` (exactly N output tokens) and
`stream: true`, so the first token's arrival is seen. The router passes all three through:
sglang-router 0.3.2's MiniLB (`sglang_router/mini_lb.py`, `handle_generate_request`) copies the
request body as it is (`request_data.copy()`), only adding bootstrap_host/port/room; a list of
ints in `input_ids` is a single request (`_get_request_batch_size`); `stream` selects
`generate_stream`, which forwards decode's SSE chunks as they come (`iter_chunked`).

prefill tokens/s = input tokens / time to first token; decode tokens/s = (output tokens - 1) /
(end-to-end - time to first token). A `kimipd:verification` baseline turns a shortfall beyond its
tolerance into a regression (exit 1).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.console import Group
from rich.table import Table
from rich.text import Text

from components.config import VerificationSpec
from components.render import door_ca_file, router_auth_header_file

from . import DEGRADED, DOWN, OK
from .probe import Tls, curl_command, direct_client, parse_curl
from .remote import RemoteError, Transport
from .topology import Topology

Request = VerificationSpec.Request
# Token ids drawn from here: ordinary vocabulary, clear of the special tokens at the low end.
TOKEN_ID_RANGE = (1000, 30000)


def prompt_ids(rng: random.Random, length: int) -> list[int]:
    """A fresh prompt per run (the seed is reported): a repeated one would be served from
    SGLang's prefix cache and report a prefill speed the cluster does not have."""
    return [rng.randrange(*TOKEN_ID_RANGE) for _ in range(length)]


class StreamTimer:
    """Reads SGLang's SSE answer as it arrives: `data: {json}` events with cumulative text and
    meta_info.completion_tokens, then `data: [DONE]`."""

    def __init__(self) -> None:
        self._pending = b""
        self.first_token: float | None = None
        self.last_event: float | None = None
        self.done: float | None = None
        self.output_tokens = 0
        self.events = 0
        self.error: str | None = None

    def feed(self, chunk: bytes, at: float) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._line(line.strip(), at)

    def close(self, at: float) -> None:
        if self._pending.strip():
            self._line(self._pending.strip(), at)
        self._pending = b""
        if self.done is None:
            self.done = at

    def _line(self, line: bytes, at: float) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = at
            return
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            return
        if "error" in event and "text" not in event:
            self.error = str(event["error"])[:300]
            return
        self.events += 1
        meta = event.get("meta_info") or {}
        tokens = meta.get("completion_tokens")
        self.output_tokens = int(tokens) if tokens is not None else self.events
        if self.first_token is None and self.output_tokens >= 1:
            self.first_token = at
        self.last_event = at


@dataclass
class Measurement:
    shape: Request
    via: str = "-"
    status: int | None = None
    output_tokens: int | None = None
    ttft: float | None = None
    e2e: float | None = None
    error: str | None = None
    reached: bool = False  # an HTTP answer came back (whatever its status)
    problems: list[str] = field(default_factory=list)

    @property
    def prefill_tokens_per_second(self) -> float | None:
        if not self.ttft:
            return None
        return self.shape.input_tokens / self.ttft

    @property
    def decode_tokens_per_second(self) -> float | None:
        if self.ttft is None or self.e2e is None or not self.output_tokens:
            return None
        if self.output_tokens < 2 or self.e2e <= self.ttft:
            return None
        return (self.output_tokens - 1) / (self.e2e - self.ttft)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        def rounded(value: float | None, digits: int) -> float | None:
            return round(value, digits) if value is not None else None

        return {
            "name": self.shape.name,
            "inputTokens": self.shape.input_tokens,
            "outputTokens": self.shape.output_tokens,
            "status": self.status,
            "outputTokensReceived": self.output_tokens,
            "ttftSeconds": rounded(self.ttft, 4),
            "e2eSeconds": rounded(self.e2e, 4),
            "prefillTokensPerSecond": rounded(self.prefill_tokens_per_second, 2),
            "decodeTokensPerSecond": rounded(self.decode_tokens_per_second, 2),
            "via": self.via,
            "error": self.error,
            "baseline": self.shape.model_dump(by_alias=True, exclude={"name", "input_tokens",
                                                                      "output_tokens"}),
            "problems": self.problems,
            "ok": self.ok,
        }


def request_body(shape: Request, rng: random.Random) -> dict[str, Any]:
    return {
        "input_ids": prompt_ids(rng, shape.input_tokens),
        "sampling_params": {"max_new_tokens": shape.output_tokens, "ignore_eos": True},
        "stream": True,
    }


def _direct(url: str, body: dict, timeout: float, measurement: Measurement,
            api_key: str | None = None, tls: Tls | None = None) -> bool:
    """Streams the answer from here; False when the router's port cannot be reached at all.
    TLS: how the door's certificate is checked (its private CA), else the system's store."""
    timer = StreamTimer()
    measurement.via = "direct"
    client = direct_client(timeout, tls.context if tls is not None else True)
    started = time.perf_counter()
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        with client, client.stream("POST", url, json=body, headers=headers) as response:
            measurement.status = response.status_code
            measurement.reached = True
            if response.status_code != 200:
                measurement.error = response.read().decode("utf-8", "replace").strip()[:300]
                return True
            for chunk in response.iter_bytes():
                timer.feed(chunk, time.perf_counter() - started)
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        measurement.error = f"router not reachable from here: {error}"
        return False
    except httpx.HTTPError as error:
        measurement.error = f"{type(error).__name__}: {error}"
    timer.close(time.perf_counter() - started)
    _take(timer, measurement)
    return True


def _over_ssh(transport: Transport, node: str, url: str, body: dict, timeout: float,
              measurement: Measurement, header_file: str | None = None,
              ca_file: str | None = None) -> None:
    """curl -N on the router's node; chunks are timed as they arrive here (the SSH hop adds
    its latency to the first token, not to the decode rate)."""
    timer = StreamTimer()
    measurement.via = "ssh"
    command = curl_command("POST", url, timeout, with_body=True, stream=True,
                           header_file=header_file, ca_file=ca_file)
    started = time.perf_counter()
    try:
        result = transport.run(node, command, timeout=timeout + 10,
                               stdin=json.dumps(body).encode(),
                               on_stdout=lambda chunk: timer.feed(
                                   chunk, time.perf_counter() - started))
    except RemoteError as error:
        measurement.error = str(error)
        return
    timer.close(time.perf_counter() - started)
    answer = parse_curl(url, result.out, result.err, result.status)
    measurement.status = answer.status
    measurement.reached = answer.status is not None
    if answer.status != 200:
        measurement.error = answer.body.strip()[:300] if answer.status else answer.error
        return
    _take(timer, measurement)


def _take(timer: StreamTimer, measurement: Measurement) -> None:
    measurement.output_tokens = timer.output_tokens
    measurement.ttft = timer.first_token
    measurement.e2e = timer.done
    if timer.error:
        measurement.error = timer.error


def judge(measurement: Measurement, tolerance: float) -> list[str]:
    shape, problems = measurement.shape, []
    if measurement.status != 200:
        problems.append(f"HTTP {measurement.status}" if measurement.status is not None
                        else measurement.error or "no answer")
        return problems
    if measurement.output_tokens != shape.output_tokens:
        problems.append(f"{measurement.output_tokens} output tokens, asked for exactly "
                        f"{shape.output_tokens}")
    if measurement.ttft is None:
        problems.append("no token arrived")
        return problems
    if shape.max_e2e_seconds is not None and measurement.e2e is not None:
        limit = shape.max_e2e_seconds * (1 + tolerance)
        if measurement.e2e > limit:
            problems.append(f"e2e {measurement.e2e:.2f}s > {shape.max_e2e_seconds:g}s "
                            f"+{tolerance:.0%}")
    for label, measured, minimum in (
            ("prefill", measurement.prefill_tokens_per_second,
             shape.min_prefill_tokens_per_second),
            ("decode", measurement.decode_tokens_per_second,
             shape.min_decode_tokens_per_second)):
        if minimum is None:
            continue
        if measured is None:
            problems.append(f"{label} tokens/s not measurable")
        elif measured < minimum * (1 - tolerance):
            problems.append(f"{label} {measured:.1f} tok/s < {minimum:g} -{tolerance:.0%}")
    return problems


@dataclass
class VerifyReport:
    stack: str
    url: str | None
    seed: int
    tolerance: float
    measurements: list[Measurement]
    exit_code: int
    verdict: str
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "generateUrl": self.url, "seed": self.seed,
                "tolerance": self.tolerance, "verdict": self.verdict,
                "exitCode": self.exit_code,
                "requests": [m.as_json() for m in self.measurements], "notes": self.notes}


def run(topology: Topology, spec: VerificationSpec, transport: Transport | None,
        timeout: float = 600.0, via: str = "auto", seed: int | None = None,
        only: list[str] | None = None, api_key: str | None = None,
        tls: Tls | None = None,
        on_progress: Callable[[str], None] | None = None) -> VerifyReport:
    """TLS: the door's certificate check (ops/status.door_tls), for an https:// generateUrl; over
    SSH, curl checks it against the door's ca.pem on the router's node. ON_PROGRESS hears which
    request is under way (a request can take minutes)."""
    progress = on_progress or (lambda message: None)
    seed = int(time.time()) if seed is None else seed
    shapes = [s for s in spec.baseline if not only or s.name in only]
    url = topology.generate_url
    if not topology.serving or not url:
        return VerifyReport(topology.stack, url, seed, spec.tolerance, [], DOWN, "down",
                            ["serving is false or the stack has no generateUrl output"])
    if not shapes:
        return VerifyReport(topology.stack, url, seed, spec.tolerance, [], DEGRADED, "nothing",
                            [f"no baseline request named {', '.join(only or [])}"])
    router = topology.router
    rng = random.Random(seed)
    measurements = []
    for number, shape in enumerate(shapes, 1):
        measurement = Measurement(shape)
        body = request_body(shape, rng)
        reachable = True
        progress(f"verify: request {number}/{len(shapes)} {shape.name} ({shape.input_tokens} in, "
                 f"{shape.output_tokens} out)")
        if via in ("auto", "direct"):
            reachable = _direct(url, body, timeout, measurement, api_key, tls)
        if (via == "ssh" or (via == "auto" and not reachable)) and transport and router:
            measurement.error = None
            progress(f"verify: request {number}/{len(shapes)} {shape.name} over SSH on "
                     f"{router.node}")
            # On the router's node the key is read from its file there (rust router).
            port = urlsplit(url).port or 80
            header_file = router_auth_header_file(port) if api_key else None
            ca_file = door_ca_file(port) if url.startswith("https://") else None
            _over_ssh(transport, router.node, url, body, timeout, measurement, header_file,
                      ca_file)
        measurement.problems = judge(measurement, spec.tolerance)
        measurements.append(measurement)
        if not measurement.reached and measurement is measurements[0]:
            break  # the router does not answer at all: the other requests would not either
    if not any(m.reached for m in measurements):
        return VerifyReport(topology.stack, url, seed, spec.tolerance, measurements, DOWN,
                            "unreachable", ["the router did not answer"])
    failing = [m for m in measurements if not m.ok]
    return VerifyReport(topology.stack, url, seed, spec.tolerance, measurements,
                        DEGRADED if failing else OK, "regression" if failing else "pass")


# -- rendering -----------------------------------------------------------------------------------


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _baseline(shape: Request) -> str:
    parts = []
    if shape.max_e2e_seconds is not None:
        parts.append(f"e2e<={shape.max_e2e_seconds:g}s")
    if shape.min_prefill_tokens_per_second is not None:
        parts.append(f"prefill>={shape.min_prefill_tokens_per_second:g}")
    if shape.min_decode_tokens_per_second is not None:
        parts.append(f"decode>={shape.min_decode_tokens_per_second:g}")
    return ", ".join(parts) or "-"


def render(report: VerifyReport) -> Group:
    title = (f"stack {report.stack}: verify {report.verdict} (POST {report.url}, seed "
             f"{report.seed}, tolerance {report.tolerance:.0%})")
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("request", "in", "out", "http", "ttft s", "e2e s", "prefill tok/s",
                   "decode tok/s", "via", "baseline", "verdict"):
        justify = "right" if column in ("in", "out", "http", "ttft s", "e2e s",
                                        "prefill tok/s", "decode tok/s") else "left"
        table.add_column(column, justify=justify, no_wrap=column != "verdict")
    for m in report.measurements:
        out = "-" if m.output_tokens is None else f"{m.output_tokens}/{m.shape.output_tokens}"
        table.add_row(m.shape.name, str(m.shape.input_tokens), out,
                      str(m.status) if m.status is not None else "-",
                      _number(m.ttft, 3), _number(m.e2e, 3),
                      _number(m.prefill_tokens_per_second, 1),
                      _number(m.decode_tokens_per_second, 1), m.via, _baseline(m.shape),
                      Text("ok", style="green") if m.ok
                      else Text("; ".join(m.problems), style="red"))
    lines: list[Any] = [table, Text(f"exit {report.exit_code}")]
    lines += [Text(note, style="yellow") for note in report.notes]
    return Group(*lines)
