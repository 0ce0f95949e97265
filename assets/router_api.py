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

import rollout_state
from rollout_state import UNRECORDED

# The script's own name (router-members, door-slots) starts every line it writes and every error.
PROGRAM = os.path.splitext(os.path.basename(sys.argv[0]))[0] or "router-members"


def log(message: str) -> None:
    print(f"{PROGRAM}: {message}", flush=True)


def fail(message: str) -> SystemExit:
    return SystemExit(f"{PROGRAM}: {message}")


# The state whose record an operator's stop is read from (`watch_for_stop`): every wait below
# ends at once when one is asked for after this script started.
_STOP_STATE: list = []


def watch_for_stop(state) -> None:
    _STOP_STATE[:] = [state]


def check_stop(waiting: str) -> None:
    """Ends this script (an error, so the step fails and the engine ends the update) when an
    operator asked the update to stop: kimipd up's Ctrl-C, `kimipd rollout stop`."""
    if _STOP_STATE and _STOP_STATE[0].stopped():
        raise fail(f"stopped by the operator while {waiting}; the rollout is at phase "
                   f"{_STOP_STATE[0].phase()} (`kimipd rollout` shows it): the next `kimipd up` "
                   "goes on from here, or back with the old config")


def wait_until(problem, timeout: float, interval: float, failure, say=None) -> float:
    """Poll PROBLEM() (why not yet, or None) until it is None; SAY(why) once per new reason
    (default: log it); FAILURE(why, elapsed) is the error after TIMEOUT. Seconds waited."""
    start, last = time.monotonic(), ""
    while True:
        why = problem()
        if why is not None:
            check_stop(f"waiting: {why}")
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
# (20 s), so a failing /health is a hung group, whose open requests never finish. Each check
# waits up to that long for its answer (rank0_healthy), so a hung group is given up at its second
# failing answer, about 40 s in.
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
        check_stop(f"draining ({current} request(s) open)")
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

    def listed(self) -> list[dict] | None:
        """GET /workers as the router lists them, or None when it does not answer."""
        status, body = self.call("GET", "/workers")
        if status != 200 or not isinstance(body, dict):
            return None
        return list(body.get("workers") or [])

    def workers(self) -> list[dict] | None:
        """The workers it holds: smg lists a removed one for 5 s more (status `draining`, never
        picked again), which is gone for everything here but a new registration of its URL."""
        listed = self.listed()
        return None if listed is None else [w for w in listed
                                            if w.get("status") != "draining"]

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
    """Markers (which groups and slots should serve) in the router's state directory, and the
    rollout's one record beside them (rollout_state.py), under one file lock: every write of
    the record happens with the lock held."""

    def __init__(self, directory: str, step: str = "") -> None:
        self.directory = directory
        # Which action of which script writes the record (kept in it: `kimipd status` says it).
        self.step = step or PROGRAM
        self._held = False
        # An operator's stop (kimipd up's Ctrl-C) ends the waits of the scripts that were
        # already running then, not those of a later update.
        self.started = time.time()
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

    # --- the record -------------------------------------------------------------------------

    def record(self) -> dict:
        return rollout_state.load(self.directory)

    def _write(self, change) -> None:
        if not self._held:
            raise RuntimeError("the rollout record is written only under the state lock")
        record = self.record()
        change(record)
        rollout_state.save(self.directory, record, self.step, sorted(self.members()))

    def phase(self) -> str:
        return rollout_state.phase_of(self.record(), sorted(self.members()))

    # The rollout's leases: a group of MODE (or, for "slot", a door slot) out for its
    # replacement, and since when.
    def lease(self, mode: str) -> tuple[str, float] | None:
        held = self.record()["leases"].get(mode)
        return (held[0], float(held[1])) if held else None

    def take_lease(self, mode: str, holder: str) -> None:
        # Taken again by its holder (a replacement that failed, tried again): a new start.
        self._write(lambda record: record["leases"].__setitem__(mode, [holder, time.time()]))

    def give_back(self, mode: str, holder: str) -> bool:
        held = self.lease(mode)
        if held and held[0] == holder:
            self._write(lambda record: record["leases"].pop(mode, None))
            return True
        return False

    def out_for_replacement(self) -> dict[str, str]:
        """mode -> the group holding its rollout lease (drained, being replaced)."""
        return {mode: held[0] for mode in ("prefill", "decode")
                if (held := self.lease(mode)) is not None}

    # The serving contract (components/render/contract.py) each group's running containers
    # were admitted with: one router must never hold a prefill and a decode of two contracts.
    def contract(self, group: str) -> str:
        return self.record()["groups"].get(group) or UNRECORDED

    def record_contract(self, group: str, digest: str) -> None:
        def change(record: dict) -> None:
            record["groups"][group] = digest
            record["target"] = digest
        self._write(change)

    def contracts(self) -> dict[str, str]:
        """group -> its contract (UNRECORDED: admitted before contracts were recorded) of every
        group that should serve."""
        groups = self.record()["groups"]
        return {group: groups.get(group) or UNRECORDED for group in self.members()}

    def contracts_by_url(self) -> dict[str, str]:
        """rank 0's URL -> its group's contract, of every group that should serve."""
        groups = self.record()["groups"]
        return {fields[1]: groups.get(group) or UNRECORDED
                for group, fields in self.members().items() if fields[1]}

    def target_contract(self) -> str | None:
        """The contract admitted last: during a rollout of a new one, the new one."""
        return self.record()["target"]

    # Each slot's contract: the one whose groups it holds, and whether it is out at
    # router.node's door to take the target's (set ready again once it holds a prefill and a
    # decode of it).
    def slot_contract(self, slot: str) -> str | None:
        return (self.record()["slots"].get(slot) or {}).get("contract")

    def converting(self, slot: str) -> str | None:
        """The contract slot SLOT is out at the door to take, or None."""
        entry = self.record()["slots"].get(slot) or {}
        return entry.get("contract") if entry.get("converting") else None

    def serve_contract(self, slot: str, contract: str, converting: bool = False) -> None:
        self._write(lambda record: record["slots"].__setitem__(
            slot, {"contract": contract, "converting": converting}))

    def forget(self, group: str | None = None, slot: str | None = None) -> None:
        """GROUP (or SLOT) leaves the record: what it ran or served, and a lease it held. Its
        marker is new or gone (a stack created or destroyed on this router port): nothing
        recorded of an earlier one's may steer this one."""
        def change(record: dict) -> None:
            if group is not None:
                record["groups"].pop(group, None)
            if slot is not None:
                record["slots"].pop(f"slot-{slot}", None)
            record["leases"] = {mode: held for mode, held in record["leases"].items()
                                if held[0] not in (group, slot)}
        self._write(change)

    # An operator's stop: the node scripts' waits end at once (kimipd up's Ctrl-C).
    def request_stop(self) -> None:
        self._write(lambda record: record.__setitem__("stop", time.time()))

    def stopped(self) -> bool:
        """Whether an operator asked, after this script started, for the update to stop."""
        stop = self.record().get("stop")
        return bool(stop and stop >= self.started)

    @contextmanager
    def locked(self):
        with open(os.path.join(self.directory, "lock"), "w", encoding="utf-8") as stream:
            fcntl.flock(stream, fcntl.LOCK_EX)
            self._held = True
            try:
                yield
            finally:
                self._held = False
                fcntl.flock(stream, fcntl.LOCK_UN)


def registered(workers: list[dict], url: str) -> list[dict]:
    return [w for w in workers if w.get("url") == url]


# How long a registration waits for its URL's removed registration to leave (smg: 5 s).
REGISTRATION_WAIT = 20.0


def pairing(worker: dict) -> str | None:
    return worker.get("pairing_protocol") or worker.get("pd_pairing")


def register(router: Router, group: str, url: str, mode: str, bootstrap: int | None,
             contract: str, settle: bool = False) -> None:
    """POST /workers, the group's serving contract as its pairing protocol: smg pairs a prefill
    and a decode only when theirs match (503 no_compatible_pd_pair otherwise), the second line
    behind the record's one contract per router. Every server requires the router's key (one
    key for client, router and workers), which the router sends on its health checks, load
    polls and fan-outs.

    smg answers 202 and probes the worker in the background (it is listed once healthy); a
    registration of the URL already there is 409: kept when of this contract (or still being
    made), else removed first (a group replaced in place by another contract); one removed a
    moment ago stays 5 s `draining`, and is waited out. SETTLE (an admission: the group is
    healthy, its contract recorded): a registration of the URL still being made (a restore's,
    perhaps before the contract was recorded) is waited for, then held to CONTRACT too."""
    body: dict = {"url": url, "worker_type": mode, "api_key": router.key,
                  "pairing_protocol": contract}
    if bootstrap is not None:
        body["bootstrap_port"] = bootstrap
    deadline = time.monotonic() + REGISTRATION_WAIT
    while True:
        status, answer = router.call("POST", "/workers", body)
        if status in (200, 201, 202):
            return
        code = answer.get("code") if isinstance(answer, dict) else None
        if status != 409:
            raise fail(f"POST {router.url}/workers for {group} ({url}) answered HTTP {status}: "
                       f"{answer}")
        there = registered(router.listed() or [], url)
        if code == "WORKER_CREATE_IN_PROGRESS" and not there:
            if not settle or time.monotonic() > deadline:
                return
            check_stop(f"registering {group}")
            time.sleep(0.5)
            continue
        if there and all(pairing(w) == contract and w.get("status") != "draining"
                         for w in there):
            return
        for worker in there:
            if worker.get("status") != "draining":
                router.call("DELETE", f"/workers/{worker.get('id')}")
                log(f"{group}: {url} was registered with {router.slot or router.url} as "
                    f"contract {pairing(worker)}, not {contract}: removed first")
        if time.monotonic() > deadline:
            raise fail(f"POST {router.url}/workers for {group} ({url}): its earlier "
                       f"registration did not leave within {REGISTRATION_WAIT:g}s ({answer})")
        check_stop(f"registering {group}")
        time.sleep(0.5)


def whole(contract: str, modes: dict[str, str], contracts: dict[str, str]) -> bool:
    """Whether the groups MODES names (group -> mode) have a prefill and a decode of CONTRACT."""
    return {mode for group, mode in modes.items()
            if contracts[group] == contract} >= {"prefill", "decode"}


def one_contract(modes: dict[str, str], contracts: dict[str, str],
                 target: str | None) -> str | None:
    """Of the contracts of the groups MODES names (group -> mode), the one an empty router
    takes: the target (the contract admitted last) where its groups have a prefill and a
    decode, else one whose groups do (the one still serving while the target's first groups
    load), else the target. None: no group."""
    known = sorted({contracts[group] for group in modes})
    ranked = ([target] if target in known else []) + [c for c in known if c != target]
    return next((c for c in ranked if whole(c, modes, contracts)),
                ranked[0] if ranked else None)


def slot_serves(held: set[str], converting: str | None, recorded: str | None,
                modes: dict[str, str], contracts: dict[str, str],
                target: str | None) -> str | None:
    """The one contract a router (slot) may hold: the one it is out at the door to take; else
    the one it holds (of two, its recorded one, else the target: the other is removed); an
    empty one takes its recorded contract while that is whole among MODES (the groups it may
    get), else `one_contract`'s."""
    if converting:
        return converting
    if len(held) == 1:
        return next(iter(held))
    if held:
        return recorded if recorded in held else target if target in held else min(held)
    if recorded is not None and whole(recorded, modes, contracts):
        return recorded
    return one_contract(modes, contracts, target)


def register_missing(router: Router, state: State, quiet: bool = False) -> list[str]:
    """Every group that should serve, is not out for its replacement and runs the contract
    this router serves (`slot_serves`), registered with ROUTER if it is not yet (under the
    state lock, as every registration is): a group of another contract is never added, and
    one found beside the slot's own contract is removed. The URLs that should be there."""
    expected = []
    name = router.slot or router.url
    with state.locked():
        out = state.out_for_replacement()
        workers = router.workers() or []
        members = state.members()
        contracts = state.contracts()
        by_url = state.contracts_by_url()
        held = {by_url[w.get("url")] for w in workers if w.get("url") in by_url}
        candidates = {group: fields[0] for group, fields in members.items()
                      if out.get(fields[0]) != group and fields[1]}
        serves = slot_serves(held, state.converting(name), state.slot_contract(name),
                             candidates, contracts, state.target_contract())
        if serves is None:
            return expected
        if state.slot_contract(name) != serves and state.converting(name) is None:
            state.serve_contract(name, serves)
        for worker in workers:
            if by_url.get(worker.get("url") or "") not in (None, serves):
                status, body = router.call("DELETE", f"/workers/{worker.get('id')}")
                log(f"{name}: held {worker.get('url')} of contract "
                    f"{by_url[worker.get('url')]} beside contract {serves}: removed "
                    f"(HTTP {status} {body or ''})".rstrip())
        registered_urls = {w.get("url") for w in workers}
        for group, (mode, url, bootstrap) in sorted(members.items()):
            if out.get(mode) == group:
                if not quiet:
                    log(f"{group}: out for its replacement (holds the {mode} lease); its "
                        "admission registers it")
                continue
            if not url:
                continue
            if contracts[group] != serves:
                if not quiet:
                    log(f"{group}: runs contract {contracts[group]}, not {name}'s ({serves}): "
                        "not registered here")
                continue
            expected.append(url)
            if url not in registered_urls:
                register(router, group, url, mode, None if bootstrap == "-" else int(bootstrap),
                         serves)
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


# SGLang 0.5.19's /health: a one-token generate, a 1 s sleep, then up to
# SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for any output before 503. A group that answers late is busy,
# not hung; the margin is for the network and a loaded node.
SGLANG_HEALTH_SECONDS = 21.0
HEALTH_MARGIN_SECONDS = 4.0


def rank0_healthy(url: str, key: str, health_seconds: float = SGLANG_HEALTH_SECONDS) -> bool:
    """Whether the group's rank 0 answers /health with 200 within HEALTH_SECONDS and a margin:
    as SGLang judges it, a busy group answers late and is healthy, a hung one answers 503."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/health",
                                                           headers=headers),
                                    timeout=health_seconds + HEALTH_MARGIN_SECONDS):
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
