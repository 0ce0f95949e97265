#!/usr/bin/env python3
"""The rust router's membership, run on the router's node (stdlib only, python3 >= 3.8).

  want    --group G --mode M --url URL [--bootstrap-port N]
                                             G should serve (a marker the drain and restore read)
  unwant  --group G --mode M --url URL       G is leaving the config (or the stack is destroyed)
  drain   --group G --mode M --url URL --rollout R --drain-timeout S
  admit   --group G --mode M --url URL [--bootstrap-port N]
  ready   --expect URL ...                   /readiness and every URL registered and healthy
  restore                                    a new router: register every group that should
                                             serve and is not out for its replacement
  slot-want    --slot S                      slot S should serve behind the door (a marker)
  slot-unwant  --slot S                      slot S is leaving (the stack is destroyed)
  slot-drain   --slot S --other O --door-socket F --drain-timeout S
  slot-admit   --slot S --door-socket F [--expect URL ...] [--mini-lb]

Common: --router URL (loopback; repeated: every slot) --api-key-file F --state-dir D
--timeout S --interval S.

sglang-router 0.3.2's worker API: POST /workers {url, worker_type, bootstrap_port} queues a job
that probes the worker until healthy; GET /workers lists id, url, worker_type, is_healthy; DELETE
/workers/{id} stops new requests at once, and requests already sent finish. There is no drain
flag, so the drain waits for the worker's own count of running requests (SGLang's /get_load).

The rollout lease (one-group-at-a-time): a group is removed from the router only while another
group of its mode is registered and healthy, and only one group per mode is out at a time: its
drain writes lease-MODE, its admission removes it. Under a file lock, so two drains that start
together cannot both see the other as the healthy one.

A replaced router starts with no worker; `restore` gives it at once every group that is running
and not drained (the markers name them), so a change that replaces the router and every group
(an image, restartGeneration) still rolls the groups behind a router that serves.

With the door (HAProxy) there are two routers, the slots, and a group is registered with both:
drain removes it from every slot that answers, once each of them has a healthy peer; admit
registers it with every slot that answers. The slot lease (lease-slot) rolls the slots one at a
time: slot-drain takes it once the other slot is up at the door, sets its own server to drain
there (no new request; the runtime API) and waits for its open requests; slot-admit registers
every group, waits for /readiness, sets the server ready, waits until the door's health check
sees it up, and gives the lease back.
"""

from __future__ import annotations

import argparse
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


def log(message: str) -> None:
    print(f"router-members: {message}", flush=True)


class Router:
    def __init__(self, url: str, key_file: str | None) -> None:
        self.url = url.rstrip("/")
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
            raise SystemExit(f"router-members: the door's admin socket {self.path} does not "
                             f"answer; cannot set {server} {state}")
        if answer.strip():
            raise SystemExit(f"router-members: the door refused `set server {self.BACKEND}/"
                             f"{server} state {state}`: {answer.strip()}")


def worker_body(router: Router, url: str, mode: str) -> dict:
    """POST /workers: every server requires the router's key (one key for client, router and
    workers), which the router sends on its health checks, load polls and fan-outs."""
    return {"url": url, "worker_type": mode, "api_key": router.key}


def healthy_peers(workers: list[dict], mode: str, url: str) -> list[str]:
    return [w["url"] for w in workers
            if w.get("worker_type") == mode and w.get("url") != url and w.get("is_healthy")]


def registered(workers: list[dict], url: str) -> list[dict]:
    return [w for w in workers if w.get("url") == url]


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


def serving_nowhere(live: list[tuple[Router, list[dict]]], url: str) -> str | None:
    """Why the group at URL serves no request now and will not by itself (so draining it
    costs nothing), or None. A live group a new router has not yet found healthy still counts
    as serving: it will within a health check, and the lease must keep one of its mode."""
    if rank0_refuses(url):
        return "its rank 0 is not running"
    if not any(w.get("is_healthy") for _, workers in live for w in registered(workers, url)) \
            and not rank0_answers(url):
        return (f"not healthy in any of {routers_said(len(live))} and its rank 0 does not "
                "answer")
    return None


def running_requests(url: str, key: str) -> int | None:
    """The worker's own count (SGLang /get_load: one entry per DP rank); None if it is gone."""
    request = urllib.request.Request(url.rstrip("/") + "/get_load",
                                     headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            loads = json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if isinstance(loads, dict):
        loads = [loads]
    return sum(int(item.get("num_reqs", 0)) + int(item.get("num_waiting_reqs", 0))
               for item in loads if isinstance(item, dict))


class State:
    """Markers and leases in the router's state directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(os.path.join(directory, "desired"), mode=0o700, exist_ok=True)

    def marker(self, group: str) -> str:
        return os.path.join(self.directory, "desired", group)

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

    def take_lease(self, mode: str, group: str) -> None:
        # Taken again by its holder (a replacement that failed, tried again): a new start.
        with open(self.lease_path(mode) + ".new", "w", encoding="utf-8") as stream:
            stream.write(f"{group} {time.time()}\n")
        os.replace(self.lease_path(mode) + ".new", self.lease_path(mode))

    def give_back(self, mode: str, group: str) -> bool:
        held = self.lease(mode)
        if held and held[0] == group:
            os.remove(self.lease_path(mode))
            return True
        return False

    @contextmanager
    def locked(self):
        with open(os.path.join(self.directory, "lock"), "w", encoding="utf-8") as stream:
            fcntl.flock(stream, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(stream, fcntl.LOCK_UN)


def remove_from_router(router: Router, url: str) -> int:
    """DELETE every registration of URL; how many there were."""
    workers = router.workers() or []
    for worker in registered(workers, url):
        status, body = router.call("DELETE", f"/workers/{worker['id']}")
        if status not in (200, 202, 204, 404):
            raise SystemExit(f"router-members: DELETE {router.url}/workers/{worker['id']} "
                             f"({url}) answered HTTP {status}: {body}")
    return len(registered(workers, url))


def routers_said(count: int) -> str:
    return "the router" if count == 1 else f"{count} routers"


def answering(routers: list[Router]) -> list[tuple[Router, list[dict]]]:
    """Every router (slot) that answers GET /workers, with its workers."""
    found = []
    for router in routers:
        workers = router.workers()
        if workers is not None:
            found.append((router, workers))
    return found


def drain(args, routers: list[Router], state: State) -> int:
    group, mode, url = args.group, args.mode, args.url
    desired = state.desired()
    peers_desired = sorted(g for g, m in desired.items() if m == mode and g != group)
    rolling = args.rollout == "one-group-at-a-time" and group in desired and peers_desired
    start = time.monotonic()
    # The wait is bounded per reason, not in total: with three groups of a mode the last one
    # waits for two replacements, each of which may take up to the gate timeout.
    last_said, said_at, reason_since = "", 0.0, start
    idle: str | None = None
    while True:
        with state.locked():
            live = answering(routers)
            if not live and not rolling:
                log(f"{group}: no router answers GET /workers; nothing to drain")
                return 0
            held = state.lease(mode)
            waiting_for, holder_out = None, False
            if rolling and not live:
                # Being replaced itself: the new one gets the serving groups (restore) first.
                waiting_for = "no router answers GET /workers (being replaced?)"
            elif rolling and (idle := serving_nowhere(live, url)) is not None:
                # Nothing to keep serving in its place: when every group of a mode is dead,
                # each is replaced at once instead of waiting for a peer that never comes.
                rolling = False
                log(f"{group}: not serving ({idle}); drained without waiting for a peer")
            elif rolling:
                holder_out = bool(held and held[0] != group and held[0] in desired)
                # Every router that serves keeps a healthy group of this mode.
                lonely = [router.url for router, workers in live
                          if not healthy_peers(workers, mode, url)]
                if holder_out:
                    waiting_for = (f"{held[0]} holds the {mode} rollout lease (drained "
                                   f"{time.time() - held[1]:.0f}s ago for its replacement, not "
                                   "yet re-admitted)")
                elif lonely:
                    waiting_for = (f"no other {mode} group is registered and healthy in "
                                   f"{', '.join(lonely)} ({', '.join(peers_desired)} should be)")
                else:
                    state.take_lease(mode, group)
            if waiting_for is None:
                removed = sum(remove_from_router(router, url) for router, _ in live)
                how = ("lease taken; " + ", ".join(sorted({peer for _, workers in live for peer
                                                          in healthy_peers(workers, mode, url)}))
                       + " keep serving" if rolling
                       else "not serving: nothing to keep" if idle is not None
                       else "no other group of its mode to keep serving"
                       if group in desired else "leaving the config")
                log(f"{group}: removed {removed} registration(s) of {url} from "
                    f"{routers_said(len(live))} ({how})")
                break
        now = time.monotonic()
        elapsed = now - start
        reason = waiting_for.split(" (")[0]
        if reason != last_said:
            reason_since = now
        # Waiting this long for one holder (or one missing peer): its gate has failed by now.
        # Not the lease's age: a lease left by an earlier, failed `up` is taken again by its
        # holder when that group's replacement is retried.
        if now - reason_since >= args.timeout:
            raise SystemExit(
                f"router-members: {group} ({mode}) not drained after {elapsed:.0f}s: "
                f"{waiting_for}. {group} keeps running and serving, untouched; the rollout "
                f"stops here. Fix the group the lease names (its gate or log says why), then "
                "`pulumi up` rolls the groups not yet replaced.")
        # Once per reason and every 30 s: the output is kept in the stack's state.
        if reason != last_said or elapsed - said_at >= 30:
            log(f"{group}: waiting: {waiting_for}")
            last_said, said_at = reason, elapsed
        time.sleep(args.interval)
    # In-flight requests: the routers send nothing new, the worker finishes what it has.
    key = routers[0].key
    deadline = time.monotonic() + args.drain_timeout
    while True:
        running = running_requests(url, key)
        if not running:
            log(f"{group}: drained ({'no requests running' if running == 0 else 'not answering'})")
            return 0
        if time.monotonic() >= deadline:
            log(f"{group}: {running} request(s) still running after {args.drain_timeout}s "
                "(router.drainTimeoutSeconds); replacing it anyway")
            return 0
        time.sleep(min(args.interval, 1.0))


def register(router: Router, group: str, url: str, mode: str, bootstrap: int | None) -> None:
    body = worker_body(router, url, mode)
    if bootstrap is not None:
        body["bootstrap_port"] = bootstrap
    status, answer = router.call("POST", "/workers", body)
    if status not in (200, 201, 202, 409):
        raise SystemExit(f"router-members: POST {router.url}/workers for {group} ({url}) "
                         f"answered HTTP {status}: {answer}")


def admit(args, routers: list[Router], state: State) -> int:
    """Registered and healthy in every router (slot) that answers; one being replaced gets the
    group from its own restore."""
    group, mode, url = args.group, args.mode, args.url
    start = time.monotonic()
    posted: set[str] = set()
    last = ""
    while True:
        live = answering(routers)
        mine = {router.url: registered(workers, url) for router, workers in live}
        if live and all(any(w.get("is_healthy") for w in found) for found in mine.values()):
            with state.locked():
                gave_back = state.give_back(mode, group)
            log(f"{group}: admitted, healthy in {routers_said(len(live))} ({url})"
                + (f"; {mode} rollout lease given back" if gave_back else ""))
            return 0
        for router, _ in live:
            if not mine[router.url] and router.url not in posted:
                register(router, group, url, mode, args.bootstrap_port)
                posted.add(router.url)
        elapsed = time.monotonic() - start
        said = ("no router answers" if not live
                else "registered, not yet healthy" if all(mine.values())
                else "registration queued")
        if elapsed >= args.timeout:
            raise SystemExit(f"router-members: {group} ({url}) not healthy in the router after "
                             f"{elapsed:.0f}s: {said}")
        if said != last:
            log(f"{group}: {said}")
            last = said
        time.sleep(args.interval)


def out_for_replacement(state: State) -> dict[str, str]:
    """mode -> the group holding its rollout lease (drained, being replaced)."""
    return {mode: held[0] for mode in ("prefill", "decode")
            if (held := state.lease(mode)) is not None}


def register_missing(router: Router, state: State, quiet: bool = False) -> list[str]:
    """Every group that should serve and is not out for its replacement, registered with ROUTER
    if it is not yet (under the state lock); the URLs that should be there."""
    expected = []
    with state.locked():
        out = out_for_replacement(state)
        registered_urls = {w.get("url") for w in router.workers() or []}
        for group, (mode, url, bootstrap) in sorted(state.members().items()):
            if out.get(mode) == group:
                if not quiet:
                    log(f"{group}: out for its replacement (holds the {mode} lease); its "
                        "admission registers it")
                continue
            if not url:
                continue
            expected.append(url)
            if url not in registered_urls:
                register(router, group, url, mode, None if bootstrap == "-" else int(bootstrap))
                log(f"{group}: registration queued ({url})")
    return expected


def wait_answering(router: Router, timeout: float, interval: float) -> None:
    start = time.monotonic()
    while router.workers() is None:
        if time.monotonic() - start >= timeout:
            raise SystemExit(f"router-members: {router.url} does not answer after {timeout}s")
        time.sleep(interval)


def restore(args, routers: list[Router], state: State) -> int:
    """Register, on a router that has just started, every group that should serve and does not
    hold its mode's lease (out for its replacement: its admission brings it back)."""
    for router in routers:
        wait_answering(router, args.timeout, args.interval)
        register_missing(router, state)
    return 0


def ready(args, routers: list[Router]) -> int:
    start = time.monotonic()
    last = ""
    while True:
        problems = []
        for router in routers:
            status, _ = router.call("GET", "/readiness")
            workers = router.workers() or []
            missing = [url for url in args.expect
                       if not any(w.get("is_healthy") for w in registered(workers, url))]
            if status != 200 or missing:
                problems.append(f"{router.url}: /readiness {status}; not healthy: "
                                f"{', '.join(missing) or 'none'}")
        if not problems:
            log(f"router ready: /readiness 200, {len(args.expect)} group(s) healthy"
                + ("" if len(routers) == 1 else f" in {routers_said(len(routers))}"))
            return 0
        said = "; ".join(problems)
        if time.monotonic() - start >= args.timeout:
            raise SystemExit(f"router-members: router not ready after {args.timeout}s: {said}")
        if said != last:
            log(f"waiting: {said}")
            last = said
        time.sleep(args.interval)


SLOT_LEASE = "slot"


def slot_marker(state: State, slot: str) -> str:
    return os.path.join(state.directory, f"slot-{slot}")


def mine_serves(status: str) -> bool:
    # "UP 1/2": one failed check, still sent requests; DRAIN: an earlier drain that did not end.
    return status.startswith("UP") or status == "DRAIN"


def slot_drain(args, state: State) -> int:
    """Before slot S's router goes: once the other slot serves at the door, S takes the slot
    lease, is set to drain there (new requests go to the other), and its open requests finish."""
    door, me, other = Door(args.door_socket), f"slot-{args.slot}", f"slot-{args.other}"
    wanted = os.path.exists(slot_marker(state, args.slot))
    start = time.monotonic()
    last_said, said_at = "", 0.0
    while True:
        with state.locked():
            servers = door.servers()
            held = state.lease(SLOT_LEASE)
            waiting_for = None
            if servers is None:
                log(f"{me}: the door does not answer; nothing to drain")
                return 0
            if not wanted:
                log(f"{me}: leaving; set to drain at the door")
            elif not mine_serves(servers.get(me, {}).get("status", "")):
                # Not serving: replacing it costs no request, and waiting on the other slot
                # would keep a dead slot dead when both are down.
                log(f"{me}: not serving at the door ({servers.get(me, {}).get('status')}); "
                    "nothing to drain")
                return 0
            elif held and held[0] != args.slot:
                waiting_for = (f"slot-{held[0]} holds the slot lease (drained "
                               f"{time.time() - held[1]:.0f}s ago for its replacement)")
            elif servers.get(other, {}).get("status") != "UP":
                waiting_for = (f"{other} is not up at the door "
                               f"({servers.get(other, {}).get('status', 'absent')})")
            else:
                state.take_lease(SLOT_LEASE, args.slot)
                log(f"{me}: slot lease taken; {other} serves")
            if waiting_for is None:
                door.set_state(me, "drain")
                break
        elapsed = time.monotonic() - start
        if elapsed >= args.timeout:
            raise SystemExit(
                f"router-members: {me} not drained after {elapsed:.0f}s: {waiting_for}. {me} "
                "keeps running and serving, untouched; fix the other slot (`kimipd status`, "
                "its log), then `pulumi up` again.")
        if waiting_for != last_said or elapsed - said_at >= 30:
            log(f"{me}: waiting: {waiting_for}")
            last_said, said_at = waiting_for, elapsed
        time.sleep(args.interval)
    # Open requests (streams included) finish through the slot; the door sends it nothing new.
    deadline = time.monotonic() + args.drain_timeout
    while True:
        row = (door.servers() or {}).get(me, {})
        current = int(row.get("scur") or 0) + int(row.get("qcur") or 0)
        if current == 0:
            log(f"{me}: drained at the door (no open request)")
            return 0
        if time.monotonic() >= deadline:
            log(f"{me}: {current} request(s) still open after {args.drain_timeout}s "
                "(router.drainTimeoutSeconds); replacing it anyway")
            return 0
        time.sleep(min(args.interval, 0.5))


def slot_admit(args, routers: list[Router], state: State) -> int:
    """Slot S's router, new: every group registered and healthy in it (rust), then set ready at
    the door; done when the door's own health check sees it up (the slot lease given back)."""
    router, door, me = routers[0], Door(args.door_socket), f"slot-{args.slot}"
    start = time.monotonic()
    last = ""
    while True:
        elapsed = time.monotonic() - start
        if args.mini_lb:
            status, _ = router.call("GET", "/health")
            said = None if status == 200 else f"/health {status}"
        else:
            expected = register_missing(router, state, quiet=True) if router.workers() is not None \
                else []
            status, _ = router.call("GET", "/readiness")
            workers = router.workers() or []
            unhealthy = [url for url in expected
                         if not any(w.get("is_healthy") for w in registered(workers, url))]
            # A group whose rank 0 does not answer at all (dead, its node lost) serves in no
            # slot: waiting for it would hold this slot out of the door for nothing.
            missing = [url for url in unhealthy if rank0_answers(url)]
            gone = sorted(set(unhealthy) - set(missing))
            said = (None if status == 200 and not missing
                    else f"/readiness {status}; not healthy: {', '.join(missing) or 'none'}")
            if said is None and gone:
                log(f"{me}: not waiting for {', '.join(gone)}: rank 0 does not answer")
        if said is None:
            break
        if elapsed >= args.timeout:
            raise SystemExit(f"router-members: {me} ({router.url}) not ready after "
                             f"{elapsed:.0f}s: {said}")
        if said != last:
            log(f"{me}: waiting: {said}")
            last = said
        time.sleep(args.interval)
    door.set_state(me, "ready")
    while True:
        row = (door.servers() or {}).get(me, {})
        if row.get("status") == "UP":
            break
        if time.monotonic() - start >= args.timeout:
            raise SystemExit(f"router-members: {me} set ready, but the door's health check "
                             f"does not see it up after {args.timeout}s ({row.get('status')}; "
                             f"`kimipd logs door` says why)")
        time.sleep(min(args.interval, 0.2))
    with state.locked():
        gave_back = state.give_back(SLOT_LEASE, args.slot)
    log(f"{me}: up at the door" + ("; slot lease given back" if gave_back else ""))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="router-members.py")
    parser.add_argument("action", choices=["want", "unwant", "drain", "admit", "ready",
                                           "restore", "slot-want", "slot-unwant", "slot-drain",
                                           "slot-admit"])
    parser.add_argument("--router", action="append", default=[])
    parser.add_argument("--api-key-file")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--interval", type=float, default=1)
    parser.add_argument("--group")
    parser.add_argument("--mode", choices=["prefill", "decode"])
    parser.add_argument("--url")
    parser.add_argument("--bootstrap-port", type=int)
    parser.add_argument("--rollout", choices=["one-group-at-a-time", "all-at-once"],
                        default="one-group-at-a-time")
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--expect", action="append", default=[])
    parser.add_argument("--slot")
    parser.add_argument("--other")
    parser.add_argument("--door-socket")
    parser.add_argument("--mini-lb", action="store_true")
    args = parser.parse_args()
    state = State(args.state_dir)
    if args.action == "slot-want":
        with open(slot_marker(state, args.slot), "w", encoding="utf-8") as stream:
            stream.write("serving\n")
        return 0
    if args.action == "slot-unwant":
        if os.path.exists(slot_marker(state, args.slot)):
            os.remove(slot_marker(state, args.slot))
        return 0
    if args.action == "slot-drain":
        return slot_drain(args, state)
    if args.action == "want":
        bootstrap = "-" if args.bootstrap_port is None else str(args.bootstrap_port)
        with open(state.marker(args.group), "w", encoding="utf-8") as stream:
            stream.write(f"{args.mode} {args.url} {bootstrap}\n")
        return 0
    if args.action == "unwant":
        if os.path.exists(state.marker(args.group)):
            os.remove(state.marker(args.group))
        return 0
    routers = [Router(url, args.api_key_file) for url in args.router]
    if not routers:
        parser.error(f"{args.action} needs --router")
    if args.action == "slot-admit":
        return slot_admit(args, routers, state)
    if args.action == "drain":
        return drain(args, routers, state)
    if args.action == "admit":
        return admit(args, routers, state)
    if args.action == "restore":
        return restore(args, routers, state)
    return ready(args, routers)


if __name__ == "__main__":
    sys.exit(main())
