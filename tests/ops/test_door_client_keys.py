"""Client keys at the door, against the real HAProxy (Debian 12's 2.6, the door image's) running
the configuration the program renders, in front of an upstream on loopback that records the
`Authorization` each request reached it with; the keys swapped by the program's own node command
(door_clients_command), its `docker exec` into the door run here on the host."""

from __future__ import annotations

import copy
import http.server
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from components.config import load_cluster_config
from components.render import door_clients_command, door_clients_map_text, key_digest
from components.render.door import door_dir, door_haproxy_config
from ops.door import parse_client_counts
from tests.conftest import stack_values
from tests.ops.loopback import free_port, wait_until

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not Path(HAPROXY).exists() or not shutil.which("socat"),
                                 reason="haproxy and socat are not installed (scripts/test "
                                        "installs Debian's packages)")]

DOOR_IMAGE = "registry.example/kimipd/door@sha256:" + "a" * 64
INTERNAL, NEW_INTERNAL = "internal-" + "1" * 32, "internal-" + "2" * 32
ALICE, BOB, CAROL = "alice-" + "a" * 32, "bob-" + "b" * 32, "carol-" + "c" * 32


def door_config(client_keys: dict[str, str]):
    values = copy.deepcopy(stack_values("pro6000"))
    values["router"]["door"] = {"image": DOOR_IMAGE,
                                "clientKeys": {name: key_digest(key)
                                               for name, key in client_keys.items()}}
    return load_cluster_config(values)


class Upstream:
    """Both slots: answers every request 200 with the Authorization it arrived with, and records
    it for each POST (the door's own checks of the slots are GETs)."""

    def __init__(self) -> None:
        seen = self.seen = []
        # Seconds each POST is held before its answer (a request in flight across a swap).
        self.delay = 0.0
        self.entered = 0
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if self.command == "POST":
                    seen.append(self.headers.get("Authorization"))
                    upstream.entered += 1
                    time.sleep(upstream.delay)
                body = (self.headers.get("Authorization") or "none").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                pass  # the door's checks close their connections at will

        self.server = Server(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Door:
    """HAProxy with the rendered door configuration, its paths moved into DIRECTORY and its
    addresses onto loopback; the program's node command writes the keys' maps."""

    def __init__(self, cfg, directory: Path, upstream: Upstream) -> None:
        self.directory, self.cfg = directory, cfg
        self.port, monitor = free_port(), free_port()
        rendered = door_haproxy_config(cfg).replace(door_dir(cfg), str(directory))
        rendered = re.sub(r"bind 0\.0\.0\.0:31000\b", f"bind 127.0.0.1:{self.port}", rendered)
        rendered = re.sub(r"bind 0\.0\.0\.0:\d+", f"bind 127.0.0.1:{monitor}", rendered)
        rendered = re.sub(r"(server slot-\w) \S+ check port \d+",
                          rf"\1 127.0.0.1:{upstream.port} check port {upstream.port}", rendered)
        (directory / "haproxy.cfg").write_text(rendered)
        (directory / "servers.state").write_text("1\n")
        self.bin = directory / "bin"
        self.bin.mkdir()
        # docker on the node: the door "runs" once started; `exec kimipd-door CMD...` runs CMD
        # here. Every argument is recorded (a key must be in none).
        (self.bin / "docker").write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >> {directory}/docker-calls
case "$1" in
  inspect) [ -e {directory}/running ] && echo true ;;
  exec) shift 2; exec "$@" ;;
esac
""")
        (self.bin / "docker").chmod(0o755)
        (directory / "docker-calls").write_text("")
        self.keys(cfg, INTERNAL)
        self.log = open(directory / "door.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(directory / "haproxy.cfg")],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        (directory / "running").touch()
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(lambda: self.ask("show info"), 20, "the door's runtime API")

    def keys(self, cfg, internal: str) -> subprocess.CompletedProcess:
        """The program's node command, as `pulumi up` runs it, with its paths in the directory."""
        script = door_clients_command(cfg).replace(door_dir(cfg), str(self.directory))
        result = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, timeout=60,
            input=f"{internal}\n{door_clients_map_text(cfg, key_digest(internal))}",
            env={"PATH": f"{self.bin}:/usr/bin:/bin"})
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    def ask(self, command: str) -> str:
        result = subprocess.run(["socat", "stdio", f"unix-connect:{self.directory}/admin.sock"],
                                input=command + "\n", capture_output=True, text=True, timeout=10)
        return result.stdout if result.returncode == 0 else ""

    def send(self, key: str | None, path: str = "/generate") -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(self.url + path, json={"text": "hi"}, headers=headers, timeout=10)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


@pytest.fixture
def door(tmp_path: Path, upstream: Upstream) -> Iterator[Door]:
    running = Door(door_config({"alice": ALICE, "carol": CAROL}), tmp_path, upstream)
    wait_until(lambda: running.send(ALICE).status_code == 200, 20, "the door to send to a slot")
    yield running
    running.stop()


def test_a_listed_key_reaches_the_routers_with_the_internal_key_only(
        door: Door, upstream: Upstream) -> None:
    answer = door.send(ALICE)
    assert (answer.status_code, answer.text) == (200, f"Bearer {INTERNAL}")
    # The program's own commands send the internal key, and are let in as client kimipd.
    assert door.send(INTERNAL).status_code == 200
    assert ALICE not in upstream.seen and set(upstream.seen) == {f"Bearer {INTERNAL}"}
    log = (door.directory / "door.log").read_text()
    assert re.search(r" 200 .* client=alice$", log, re.MULTILINE), log
    assert re.search(r" 200 .* client=kimipd$", log, re.MULTILINE), log
    # What status reads (and reconcile exports, kimipd_door_client_requests_total).
    counts = parse_client_counts(door.ask("show table door_clients"))
    assert counts == {"alice": 2, "kimipd": 1}, counts  # the fixture's first request, then ours


def test_an_unknown_or_missing_key_is_refused_at_the_door(door: Door, upstream: Upstream) -> None:
    before = len(upstream.seen)
    for key in ("not-a-listed-key", None, key_digest(ALICE)):
        answer = door.send(key)
        assert answer.status_code == 401, (key, answer.text)
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert len(upstream.seen) == before  # no router saw them
    # /health stays open, as the routers' and SGLang's own are.
    assert httpx.get(door.url + "/health", timeout=10).status_code == 200


def test_keys_added_revoked_and_the_internal_key_changed_without_a_reload(
        door: Door, upstream: Upstream) -> None:
    """Each swap by the node command into the running door begins while one of carol's requests
    is held at a slot, and carol sends all along: not one of her requests fails while alice is
    revoked, bob added and the internal key changed."""
    upstream.delay = 0.5
    failed, sent, stop = [], [0], threading.Event()

    def carol() -> None:
        while not stop.is_set():
            answer = door.send(CAROL)
            sent[0] += 1
            if answer.status_code != 200:
                failed.append(answer.status_code)

    def across(keys: dict[str, str], internal: str) -> subprocess.CompletedProcess:
        """The swap to KEYS and INTERNAL, begun with a request of carol's in flight."""
        held: dict[str, httpx.Response] = {}
        entered = upstream.entered
        request = threading.Thread(target=lambda: held.update(answer=door.send(CAROL)))
        request.start()
        wait_until(lambda: upstream.entered > entered, 10, "carol's request at a slot")
        swap = door.keys(door_config(keys), internal)
        request.join(30)
        assert held["answer"].status_code == 200, held
        return swap

    worker = threading.Thread(target=carol)
    worker.start()
    try:
        swap = across({"bob": BOB, "carol": CAROL}, INTERNAL)
        assert "the running door holds the new keys" in swap.stdout
        assert door.send(ALICE).status_code == 401
        assert door.send(BOB).status_code == 200
        across({"bob": BOB, "carol": CAROL}, NEW_INTERNAL)
        assert door.send(BOB).text == f"Bearer {NEW_INTERNAL}"
        assert door.send(NEW_INTERNAL).status_code == 200  # the program's own, the new key
        assert door.send(INTERNAL).status_code == 401
    finally:
        stop.set()
        worker.join(timeout=30)
    assert sent[0] > 0 and failed == [], (sent, failed)
    log = (door.directory / "door.log").read_text()
    assert door.process.poll() is None and "reload" not in log.lower(), log
    # The maps on disk, for the door's next load: digests only in the clients' map.
    clients = (door.directory / "clients.map").read_text()
    assert key_digest(BOB) in clients and BOB not in clients and key_digest(ALICE) not in clients
    assert (door.directory / "internal-key.map").stat().st_mode & 0o077 == 0
    # No key on any command line: the node command's docker calls hold none.
    calls = (door.directory / "docker-calls").read_text()
    assert "exec kimipd-door sh -c" in calls
    for key in (INTERNAL, NEW_INTERNAL, BOB, CAROL):
        assert key not in calls
