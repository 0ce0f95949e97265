"""B6's pure parts (bench/availability.py, bench/timeline.py) and the shared load (bench/load.py)
against a server on loopback: no sim, no engine."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench.availability import KINDS, SCENARIOS, render, slot_states, summary, unit_of
from bench import availability
from bench.availability import main as availability_main
from bench.load import Answer, Load, generate, request_bytes
from bench.timeline import Timeline, draw, per_second, unit_spans
from tests import fake_servers

GROUPS = {
    "prefill-a": {"mode": "prefill", "nodes": ["10.231.60.1", "10.231.60.2"]},
    "decode-b": {"mode": "decode", "nodes": ["10.231.60.7", "10.231.60.8"]},
}
COMMAND = "command:remote:Command"
CONTAINER = "docker:index/container:Container"


def test_requests_are_counted_by_the_second_they_were_sent_in_and_by_outcome() -> None:
    requests = [(0.1, True), (0.9, False), (1.0, True), (2.5, True), (3.7, False),
                (-0.2, True), (9.0, False)]  # before the start / after the end: the nearest
    assert per_second(requests, 3.5) == {"ok": [2, 1, 1, 0], "failed": [1, 0, 0, 2]}
    assert per_second([], 0.0) == {"ok": [0], "failed": [0]}


def test_each_unit_spans_from_its_first_step_to_its_last_in_the_order_they_began() -> None:
    steps = [(12.0, "router-a", "router-a-door-drain"), (30.5, "router-a", "router-a-door-admit"),
             (4.0, "decode-b", "decode-b-drain"), (9.0, "decode-b", "node-10-231-60-7-decode"),
             (20.0, "router-a", "router-a")]
    assert unit_spans(steps) == [("decode-b", 4.0, 9.0), ("router-a", 12.0, 30.5)]


def test_the_timeline_is_drawn_to_a_png(tmp_path: Path) -> None:
    timeline = Timeline(
        "rust: (c) slot a SIGKILLed", 6.0,
        requests=[(t / 10, not 20 <= t < 25) for t in range(60)],
        door=[(0.0, 2), (2.0, None), (2.5, 1), (5.0, 2)],
        groups=[(0.0, 2, 2), (3.0, 2, 1), (5.5, 2, 2)],
        steps=[(2.2, "router-a", "router-a"), (4.8, "router-a", "router-a-door-admit")],
        events=[(1.9, "SIGKILL router-a"), (2.1, "reconcile pass")])
    path = tmp_path / "plots" / "b6-rust-slot-killed.png"
    draw(timeline, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_an_empty_timeline_still_draws(tmp_path: Path) -> None:
    draw(Timeline("nothing recorded", 0.0), tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 0


def test_the_slots_state_is_read_from_the_doors_exporter() -> None:
    metrics = "\n".join([
        "# HELP haproxy_server_status Current status of the server.",
        "# TYPE haproxy_server_status gauge",
        'haproxy_server_status{proxy="slots",server="slot-a",state="DOWN"} 0',
        'haproxy_server_status{proxy="slots",server="slot-a",state="UP"} 0',
        'haproxy_server_status{proxy="slots",server="slot-a",state="DRAIN"} 1',
        'haproxy_server_status{proxy="slots",server="slot-b",state="UP"} 1',
        'haproxy_server_status{proxy="other",server="x",state="UP"} 1',
        'haproxy_backend_active_servers{proxy="slots"} 1',
    ])
    assert slot_states(metrics) == {"slot-a": "DRAIN", "slot-b": "UP"}
    assert slot_states("") == {}


@pytest.mark.parametrize(("name", "type_", "unit"), [
    ("router-a", CONTAINER, "router-a"),
    ("router-b-door-drain", COMMAND, "router-b"),
    ("door", CONTAINER, "door"),
    ("door-config", COMMAND, "door"),
    ("prefill-a-r0-health", COMMAND, "prefill-a"),
    ("decode-b-admit", COMMAND, "decode-b"),
    ("node-10-231-60-8-decode", CONTAINER, "decode-b"),
    ("node-10-231-60-8-prefill", CONTAINER, None),  # no prefill group on that node
    ("node-10-231-60-1-prepared-image", COMMAND, None),
    ("smoke-test", COMMAND, None),
    ("decode-b", "kimipd:serving:ServingGroup", None),  # components: their children count
])
def test_each_resource_belongs_to_its_unit(name: str, type_: str, unit: str | None) -> None:
    assert unit_of(name, type_, GROUPS) == unit


def answer(sent: float, done: float, status: int = 200, error: str = "") -> Answer:
    return Answer(sent, done, False, status, error)


def test_a_scenario_counts_failures_by_outcome_and_those_open_at_the_kill() -> None:
    answers = [answer(0.0, 0.5), answer(0.5, 1.6, 200, "cut"), answer(0.9, 1.2, 0, "reset"),
               answer(1.05, 1.3), answer(1.3, 1.4, 503), answer(2.0, 2.9)]
    row = summary(answers, kill=(1.0, 1.1))
    assert row["sent"] == 6
    assert row["failed"] == {"503": 1, "cut": 1, "reset": 1}
    # Open at the kill: sent before `docker kill` returned (1.1), answered after it was sent (1.0)
    assert (row["open_at_kill"], row["failed_open_at_kill"], row["failed_after_kill"]) == (3, 2, 1)
    assert row["p50"] == pytest.approx(0.5)
    assert "open_at_kill" not in summary(answers, kill=None)


def b6_results() -> dict[str, Any]:
    """B6's results as a run leaves them (figures made up), timelines included."""
    def row(failed: dict[str, int], **extra: object) -> dict[str, object]:
        timeline = Timeline("made up", 2.0, requests=[(0.5, True), (1.5, False)],
                            door=[(0.0, 2), (1.0, 1)], groups=[(0.0, 2, 2)])
        return {"sent": 300, "failed": failed, "p50": 1.02, "p99": 1.31, "wall_seconds": 41.4,
                "fewest": {"slots_up": 1, "prefill": 1, "decode": 2},
                "timeline": asdict(timeline), **extra}

    scenarios = {"router-flag": row({}), "every-container": row({"503": 3, "refused": 1}),
                 "slot-killed": row({"reset": 2}, open_at_kill=7, failed_open_at_kill=2,
                                    decision="healed: healed router-a in 30s"),
                 "router-node-lost": row({"timeout": 9, "reset": 1}, open_at_kill=10,
                                         failed_open_at_kill=10,
                                         decision="healed: healed decode-a in 40s")}
    overhead = {"door": {"sent": 300, "failed": 0, "p50": 0.0051, "p99": 0.0093},
                "slot a": {"sent": 300, "failed": 1, "p50": 0.0047, "p99": 0.0088}}
    return {"rate": 10.0, "kinds": {kind: {"scenarios": copy.deepcopy(scenarios),
                                           "overhead": overhead} for kind in KINDS}}


def test_the_table_puts_rust_and_minilb_side_by_side() -> None:
    table = render(b6_results()).splitlines()
    assert table[0] == "| scenario | measure | rust | mini-lb |"
    assert f"| {SCENARIOS['router-flag']} | sent | 300 | 300 |" in table
    assert "|  | failed (by status / error) | 4 (503: 3, refused: 1) | 4 (503: 3, refused: 1) |" \
        in table
    assert "|  | failed of those open at the kill | 2 of 7 | 2 of 7 |" in table
    assert "|  | up (heal) s | 41 | 41 |" in table
    assert "|  | straight to slot a (300, alternating) | 4.7 / 8.8 (1 failed) | " \
           "4.7 / 8.8 (1 failed) |" in table
    assert not [line for line in table if "open at the kill | -" in line]
    assert f"| {SCENARIOS['router-node-lost']} | sent | 300 | 300 |" in table
    assert "|  | failed of those open at the kill | 10 of 10 | 10 of 10 |" in table


def test_a_run_from_before_a_scenario_was_added_still_tables() -> None:
    results = b6_results()
    for kind in KINDS:
        del results["kinds"][kind]["scenarios"]["router-node-lost"]
    table = render(results)
    assert SCENARIOS["slot-killed"] in table and SCENARIOS["router-node-lost"] not in table


def test_a_saved_run_is_drawn_and_tabled_again(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "latest.json"
    saved.write_text(json.dumps({"results": {"B6": b6_results()}}))
    assert availability_main([str(saved), "--plots", str(tmp_path / "plots")]) == 0
    drawn = sorted(path.name for path in (tmp_path / "plots").iterdir())
    assert drawn == sorted(f"b6-{kind}-{scenario}.png" for kind in KINDS for scenario in SCENARIOS)
    # Outside docs/ the image is named by its full path.
    assert f"({tmp_path}/plots/b6-rust-router-flag.png)" in capsys.readouterr().out


# -- the load, against a server on this machine's loopback ---------------------------------------

class Generate(BaseHTTPRequestHandler):
    """/generate as the routers answer it: SSE to [DONE] when streamed, else JSON."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.headers["Authorization"] == "Bearer key"
        body = (b'data: {"text": "a"}\n\ndata: [DONE]\n\n' if request["stream"]
                else b'{"text": "a"}')
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Generate)
    fake_servers.serve(httpd)
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    fake_servers.stop(httpd)


def test_the_load_sends_on_the_clock_and_streams_every_other_request(server: str) -> None:
    with Load(40.0, server, "key", tokens=4) as load:
        time.sleep(0.5)
    answers = load.results
    # ~20 at 40/s for 0.5 s; a busy machine's late clock thread sends fewer. 5 are enough to
    # tell a load that keeps sending from one that sent once, and to show the alternation.
    assert len(answers) >= 5
    assert all(a.ok for a in answers), [a.outcome for a in answers]
    assert [a.streamed for a in answers] == [i % 2 == 1 for i in range(len(answers))]
    assert load.failed() == [] and "0 failed" in load.summary("steady")


def answered_once(reply: bytes) -> tuple[Answer, bytes]:
    """generate() against a listener that answers REPLY to one connection: its Answer and what
    the listener's first recv got (the first segment)."""
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    first: list[bytes] = []

    def answer_once() -> None:
        connection, _ = listener.accept()
        with connection:
            first.append(connection.recv(65536))
            connection.sendall(reply)
    # A daemon: one whose accept() never returned must not hold the interpreter at exit.
    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    got = generate(url, "key", tokens=1, streamed=True, timeout=5)
    thread.join(5)
    try:
        listener.shutdown(socket.SHUT_RDWR)  # wakes an accept() still waiting; close() does not
    except OSError:
        pass
    listener.close()
    assert first, "nothing reached the listener"
    return got, first[0]


def test_each_request_goes_out_in_one_segment_headers_and_body_together() -> None:
    body = b"data: {}\n\ndata: [DONE]\n\n"
    got, segment = answered_once(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(body), body))
    assert got.ok and got.streamed, got
    headers, sent_body = segment.split(b"\r\n\r\n", 1)
    assert json.loads(sent_body) == {"text": "load", "stream": True,
                                     "sampling_params": {"max_new_tokens": 1}}
    assert b"\r\nAuthorization: Bearer key" in headers
    assert segment == request_bytes(got_url(headers), "/generate", sent_body, "key")


def got_url(headers: bytes) -> str:
    host = next(line for line in headers.split(b"\r\n") if line.startswith(b"Host: "))
    return "http://" + host[len(b"Host: "):].decode()


def test_a_stream_without_its_end_or_cut_under_its_200_fails() -> None:
    body = b"data: {}\n\n"
    got, _ = answered_once(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
    assert (got.status, got.outcome) == (200, "incomplete")
    got, _ = answered_once(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n" + body)
    assert (got.status, got.outcome) == (200, "cut")
    got, _ = answered_once(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
    assert (got.status, got.outcome) == (503, "503")


def test_a_refused_connection_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    got = generate(f"http://127.0.0.1:{port}", None, tokens=1, streamed=False, timeout=5)
    assert (got.status, got.outcome, got.ok) == (0, "refused", False)


class Cluster(BaseHTTPRequestHandler):
    """The door's exporter (slot b DRAIN), every group's /health and /generate, on one port."""

    def do_GET(self) -> None:
        body = (b'haproxy_server_status{proxy="slots",server="slot-a",state="UP"} 1\n'
                b'haproxy_server_status{proxy="slots",server="slot-b",state="DRAIN"} 1\n'
                if self.path == "/metrics" else b"")
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = Generate.do_POST

    def log_message(self, *_: object) -> None:
        pass


def test_a_scenario_records_the_load_the_door_and_the_groups_while_it_acts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(availability, "LEAD_SECONDS", 0.3)
    monkeypatch.setattr(availability, "API_KEY", "key")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Cluster)
    fake_servers.serve(httpd)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    groups = {name: {**spec, "endpoint": url} for name, spec in GROUPS.items()}
    probes = availability.Probes(url, "127.0.0.1", url + "/metrics", {}, groups)

    def act(run: availability.Run) -> None:
        started = run.mark("up started")
        time.sleep(1.2)
        run.wall = run.mark("up done") - started

    try:
        row, timeline = availability.run_scenario("made up", probes, 10.0, act)
    finally:
        fake_servers.stop(httpd)
    assert row["sent"] >= 10 and row["failed"] == {}, row
    # Sleeps and threads only ever run late on a busy machine: a duration is bounded from below
    # (the sleeps), and where it comes from is checked by order, not by an upper bound.
    assert row["fewest"] == {"slots_up": 1, "prefill": 1, "decode": 1}
    (started, _), (done, _) = timeline.events
    assert [what for _, what in timeline.events] == ["up started", "up done"]
    # The wall time is the act's own, from its first mark to its last, without the leads.
    assert row["wall_seconds"] >= 1.2
    assert row["wall_seconds"] == pytest.approx(done - started, abs=0.002)
    assert started >= 0.3, "the act began before the load's lead"
    sent = [at for at, _ in timeline.requests]
    # The load and the sampler run through the act: requests before it and after it, the
    # timeline ending after the lead that follows it (times rounded to the millisecond).
    assert min(sent) < started and max(sent) >= done, (started, done, sent)
    assert timeline.seconds >= done + 0.299 and len(timeline.requests) == row["sent"]
    assert len(timeline.door) >= 3 and {up for _, up in timeline.door} == {1}
    assert {(p, d) for _, p, d in timeline.groups} == {(1, 1)}


def test_an_answer_made_from_another_contracts_kv_is_counted_as_mixed() -> None:
    """The sim's oracle: a decode stand-in marks such an answer in its meta_info, streamed or
    not; the load counts it, whatever its status says."""
    body = (b'data: {"text": "x", "meta_info": {"kv_contract_mismatch": {"prefill": "a", '
            b'"decode": "b"}}}\n\ndata: [DONE]\n\n')
    got, _ = answered_once(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
    assert got.ok and got.mixed, got
    body = b'data: {"text": "x", "meta_info": {}}\n\ndata: [DONE]\n\n'
    got, _ = answered_once(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
    assert got.ok and not got.mixed, got
