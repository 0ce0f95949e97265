"""What router-members.py (the groups) and door-slots.py (the door's slots) share, on the
router's node (stdlib only, python3 >= 3.8): the routers' worker API, the door's runtime API,
the state directory's markers, leases and lock, and the poll loop both wait in."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager

# The script's own name (router-members, door-slots) starts every line it writes and every error.
PROGRAM = os.path.splitext(os.path.basename(sys.argv[0]))[0] or "router-members"


def log(message: str) -> None:
    print(f"{PROGRAM}: {message}", flush=True)


def fail(message: str) -> SystemExit:
    return SystemExit(f"{PROGRAM}: {message}")


def wait_until(problem, timeout: float, interval: float, failure, say=None) -> float:
    """Poll PROBLEM() (why not yet, or None) until it is None; SAY(why) once per new reason
    (default: log it); FAILURE(why, elapsed) is the error after TIMEOUT. Seconds waited."""
    start, last = time.monotonic(), ""
    while True:
        why = problem()
        elapsed = time.monotonic() - start
        if why is None:
            return elapsed
        if elapsed >= timeout:
            raise fail(failure(why, elapsed))
        if why != last:
            (say or log)(why)
            last = why
        time.sleep(interval)


# How long a draining worker's rank 0 must fail its /health before its open requests are given
# up: SGLang's answers 503 only once its scheduler gave no output for SGLANG_HEALTH_CHECK_TIMEOUT
# (20 s), so a failing /health is a hung group, whose open requests never finish.
STUCK_SECONDS = 15.0


def wait_idle(count, drain_timeout: float, interval: float, idle, still_open,
              stuck=None, given_up=None, stuck_seconds: float = STUCK_SECONDS) -> None:
    """Poll COUNT() (open requests; 0 or None: none) until it is none, then log IDLE(count);
    after DRAIN_TIMEOUT log STILL_OPEN(count) and return anyway (the replacement goes on).
    STUCK() (optional) says the worker cannot finish them (its /health fails): once it has said
    so for STUCK_SECONDS in a row, log GIVEN_UP(count) and return without waiting longer."""
    deadline = time.monotonic() + drain_timeout
    stuck_since = None
    while True:
        current = count()
        if not current:
            log(idle(current))
            return
        if stuck is not None:
            if stuck():
                stuck_since = stuck_since or time.monotonic()
                if time.monotonic() - stuck_since >= stuck_seconds:
                    log(given_up(current))
                    return
            else:
                stuck_since = None
        if time.monotonic() >= deadline:
            log(still_open(current))
            return
        time.sleep(interval)


class Router:
    def __init__(self, url: str, key_file: str | None, slot: str | None = None) -> None:
        self.url = url.rstrip("/")
        # The door's name for it (slot-a, slot-b), where it is a slot behind the door.
        self.slot = slot
        self.key = ""
        if key_file:
            with open(key_file, encoding="utf-8") as stream:
                self.key = stream.read().strip()

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read().decode()
                status = response.status
        except urllib.error.HTTPError as error:
            text, status = error.read().decode(errors="replace"), error.code
        except (urllib.error.URLError, OSError) as error:
            return 0, str(error)
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def workers(self) -> list[dict] | None:
        """GET /workers, or None when the router does not answer it."""
        status, body = self.call("GET", "/workers")
        if status != 200 or not isinstance(body, dict):
            return None
        return list(body.get("workers") or [])

    def unhealthy(self, urls: list[str]) -> list[str]:
        """Of URLS, those not registered and healthy here (all of them if it does not answer)."""
        workers = self.workers() or []
        return [url for url in urls if not any(w.get("is_healthy")
                                               for w in registered(workers, url))]


class Door:
    """HAProxy's runtime API on its admin socket (the door's backend `slots`)."""

    BACKEND = "slots"

    def __init__(self, path: str) -> None:
        self.path = path

    def ask(self, line: str) -> str | None:
        """One command; None when the door does not answer (not there, or being replaced)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect(self.path)
                conn.sendall(line.encode() + b"\n")
                chunks = []
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
        except OSError:
            return None
        return b"".join(chunks).decode(errors="replace")

    def servers(self) -> dict[str, dict[str, str]] | None:
        """server -> its `show stat` row (status: UP, DOWN, MAINT, DRAIN, "UP 1/2", ...)."""
        text = self.ask("show stat")
        if not text or not text.startswith("# "):
            return None
        lines = text[2:].strip().splitlines()
        header = lines[0].split(",")
        rows = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == self.BACKEND and row.get("svname") not in ("BACKEND",
                                                                               "FRONTEND"):
                rows[row["svname"]] = row
        return rows

    def set_state(self, server: str, state: str) -> None:
        answer = self.ask(f"set server {self.BACKEND}/{server} state {state}")
        if answer is None:
            raise fail(f"the door's admin socket {self.path} does not answer; cannot set "
                       f"{server} {state}")
        if answer.strip():
            raise fail(f"the door refused `set server {self.BACKEND}/{server} state {state}`: "
                       f"{answer.strip()}")


class State:
    """Markers (who should serve) and leases (who is out for its replacement) in the router's
    state directory, under one file lock."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(os.path.join(directory, "desired"), mode=0o700, exist_ok=True)

    def marker(self, group: str) -> str:
        return os.path.join(self.directory, "desired", group)

    def slot_marker(self, slot: str) -> str:
        return os.path.join(self.directory, f"slot-{slot}")

    @staticmethod
    def mark(path: str, line: str) -> None:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(line + "\n")

    @staticmethod
    def unmark(path: str) -> None:
        if os.path.exists(path):
            os.remove(path)

    def members(self) -> dict[str, list[str]]:
        """group -> [mode, url, bootstrap port or "-"] of every group that should serve."""
        found = {}
        folder = os.path.join(self.directory, "desired")
        for name in os.listdir(folder):
            with open(os.path.join(folder, name), encoding="utf-8") as stream:
                found[name] = (stream.read().split() + ["", "", "-"])[:3]
        return found

    def desired(self) -> dict[str, str]:
        """group -> mode of every group that should serve."""
        return {name: fields[0] for name, fields in self.members().items()}

    def lease_path(self, mode: str) -> str:
        return os.path.join(self.directory, f"lease-{mode}")

    def lease(self, mode: str) -> tuple[str, float] | None:
        try:
            with open(self.lease_path(mode), encoding="utf-8") as stream:
                holder, since = stream.read().split()
            return holder, float(since)
        except (OSError, ValueError):
            return None

    def take_lease(self, mode: str, holder: str) -> None:
        # Taken again by its holder (a replacement that failed, tried again): a new start.
        with open(self.lease_path(mode) + ".new", "w", encoding="utf-8") as stream:
            stream.write(f"{holder} {time.time()}\n")
        os.replace(self.lease_path(mode) + ".new", self.lease_path(mode))

    def give_back(self, mode: str, holder: str) -> bool:
        held = self.lease(mode)
        if held and held[0] == holder:
            os.remove(self.lease_path(mode))
            return True
        return False

    # The serving contract (components/render/contract.py) each group's running containers
    # were admitted with: one router must never hold a prefill and a decode of two contracts.
    def contract_path(self, group: str) -> str:
        return os.path.join(self.directory, "contract", group)

    def contract(self, group: str) -> str | None:
        try:
            with open(self.contract_path(group), encoding="utf-8") as stream:
                return stream.read().strip() or None
        except OSError:
            return None

    def record_contract(self, group: str, digest: str) -> None:
        os.makedirs(os.path.dirname(self.contract_path(group)), mode=0o700, exist_ok=True)
        self.mark(self.contract_path(group), digest)

    def contracts(self) -> dict[str, str | None]:
        """group -> its recorded contract (None: admitted before contracts were recorded) of
        every group that should serve."""
        return {group: self.contract(group) for group in self.members()}

    def contracts_by_url(self) -> dict[str, str]:
        """rank 0's URL -> its group's contract, where one is recorded."""
        return {fields[1]: contract for group, fields in self.members().items()
                if (contract := self.contract(group)) is not None}

    def target_contract(self) -> str | None:
        """The contract admitted last: during a rollout of a new one, the new one."""
        folder = os.path.join(self.directory, "contract")
        try:
            names = os.listdir(folder)
        except OSError:
            return None
        newest = max(names, default=None,
                     key=lambda name: os.stat(os.path.join(folder, name)).st_mtime_ns)
        return self.contract(newest) if newest is not None else None

    def converting_marker(self, slot: str) -> str:
        """Slot SLOT was taken out at the door to change its contract: set ready again once it
        holds a prefill and a decode of one contract."""
        return os.path.join(self.directory, f"converting-{slot}")

    def out_for_replacement(self) -> dict[str, str]:
        """mode -> the group holding its rollout lease (drained, being replaced)."""
        return {mode: held[0] for mode in ("prefill", "decode")
                if (held := self.lease(mode)) is not None}

    @contextmanager
    def locked(self):
        with open(os.path.join(self.directory, "lock"), "w", encoding="utf-8") as stream:
            fcntl.flock(stream, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(stream, fcntl.LOCK_UN)


def registered(workers: list[dict], url: str) -> list[dict]:
    return [w for w in workers if w.get("url") == url]


def register(router: Router, group: str, url: str, mode: str, bootstrap: int | None) -> None:
    """POST /workers: every server requires the router's key (one key for client, router and
    workers), which the router sends on its health checks, load polls and fan-outs."""
    body: dict = {"url": url, "worker_type": mode, "api_key": router.key}
    if bootstrap is not None:
        body["bootstrap_port"] = bootstrap
    status, answer = router.call("POST", "/workers", body)
    if status not in (200, 201, 202, 409):
        raise fail(f"POST {router.url}/workers for {group} ({url}) answered HTTP {status}: "
                   f"{answer}")


def one_contract(modes: dict[str, str], contracts: dict[str, str | None],
                 target: str | None) -> set[str]:
    """Of the groups MODES names (group -> mode), those one router may hold at once: the groups
    of one contract, and those with none recorded (admitted before contracts were). The target
    (the contract admitted last) where its groups have a prefill and a decode, else a contract
    whose groups do (the one still serving while the target's first groups load)."""
    known = sorted({contract for contract in contracts.values() if contract})
    if len(known) <= 1:
        return set(modes)

    def whole(contract: str) -> bool:
        return {modes[group] for group in modes
                if contracts.get(group) == contract} >= {"prefill", "decode"}

    ranked = ([target] if target in known else []) + [c for c in known if c != target]
    chosen = next((contract for contract in ranked if whole(contract)), ranked[0])
    return {group for group in modes if contracts.get(group) in (None, chosen)}


def register_missing(router: Router, state: State, quiet: bool = False) -> list[str]:
    """Every group that should serve and is not out for its replacement, registered with ROUTER
    if it is not yet (under the state lock), of one contract (`one_contract`); the URLs that
    should be there."""
    expected = []
    with state.locked():
        out = state.out_for_replacement()
        registered_urls = {w.get("url") for w in router.workers() or []}
        members = state.members()
        candidates = {group: fields[0] for group, fields in members.items()
                      if out.get(fields[0]) != group and fields[1]}
        contracts = state.contracts()
        chosen = one_contract(candidates, contracts, state.target_contract())
        for group, (mode, url, bootstrap) in sorted(members.items()):
            if out.get(mode) == group:
                if not quiet:
                    log(f"{group}: out for its replacement (holds the {mode} lease); its "
                        "admission registers it")
                continue
            if not url:
                continue
            if group not in chosen:
                if not quiet:
                    log(f"{group}: runs contract {contracts.get(group)}, not this router's: "
                        "not registered here")
                continue
            expected.append(url)
            if url not in registered_urls:
                register(router, group, url, mode, None if bootstrap == "-" else int(bootstrap))
                log(f"{group}: registration queued ({url})")
    return expected


def rank0_refuses(url: str) -> bool:
    """Whether nothing listens on the group's rank-0 port (its process is gone). A slow or
    overloaded server still accepts the connection, so it counts as running."""
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=3):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def rank0_answers(url: str) -> bool:
    """Whether the group's rank 0 answers HTTP at all (any status: a keyed server says 401)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=3):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def rank0_healthy(url: str, key: str) -> bool:
    """Whether the group's rank 0 answers /health with 200 (SGLang's runs a one-token generate)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/health",
                                                           headers=headers), timeout=5):
            return True
    except (urllib.error.URLError, OSError, ValueError):  # HTTPError (503, 401) among them
        return False


def routers_said(count: int) -> str:
    return "the router" if count == 1 else f"{count} routers"


def common_arguments(parser) -> None:
    """The options every action of both scripts takes."""
    parser.add_argument("--router", action="append", default=[])
    parser.add_argument("--api-key-file")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--interval", type=float, default=1)
