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

Common: --router URL (loopback) --api-key-file F --state-dir D --timeout S --interval S.

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
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager


def log(message: str) -> None:
    print(f"router-members: {message}", flush=True)


class Router:
    def __init__(self, url: str, key_file: str) -> None:
        self.url = url.rstrip("/")
        with open(key_file, encoding="utf-8") as stream:
            self.key = stream.read().strip()

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
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


def worker_body(router: Router, url: str, mode: str) -> dict:
    """POST /workers: every server requires the router's key (one key for client, router and
    workers), which the router sends on its health checks, load polls and fan-outs."""
    return {"url": url, "worker_type": mode, "api_key": router.key}


def healthy_peers(workers: list[dict], mode: str, url: str) -> list[str]:
    return [w["url"] for w in workers
            if w.get("worker_type") == mode and w.get("url") != url and w.get("is_healthy")]


def registered(workers: list[dict], url: str) -> list[dict]:
    return [w for w in workers if w.get("url") == url]


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
            raise SystemExit(f"router-members: DELETE /workers/{worker['id']} ({url}) answered "
                             f"HTTP {status}: {body}")
    return len(registered(workers, url))


def drain(args, router: Router, state: State) -> int:
    group, mode, url = args.group, args.mode, args.url
    desired = state.desired()
    peers_desired = sorted(g for g, m in desired.items() if m == mode and g != group)
    rolling = args.rollout == "one-group-at-a-time" and group in desired and peers_desired
    start = time.monotonic()
    # The wait is bounded per reason, not in total: with three groups of a mode the last one
    # waits for two replacements, each of which may take up to the gate timeout.
    last_said, said_at, reason_since = "", 0.0, start
    while True:
        with state.locked():
            workers = router.workers()
            if workers is None and not rolling:
                log(f"{group}: the router does not answer GET /workers; nothing to drain")
                return 0
            held = state.lease(mode)
            waiting_for, holder_out = None, False
            if rolling and workers is None:
                # Being replaced itself: the new one gets the serving groups (restore) first.
                waiting_for = "the router does not answer GET /workers (being replaced?)"
            elif rolling:
                holder_out = bool(held and held[0] != group and held[0] in desired)
                peers = healthy_peers(workers, mode, url)
                if holder_out:
                    waiting_for = (f"{held[0]} holds the {mode} rollout lease (drained "
                                   f"{time.time() - held[1]:.0f}s ago for its replacement, not "
                                   "yet re-admitted)")
                elif not peers:
                    waiting_for = (f"no other {mode} group is registered and healthy "
                                   f"({', '.join(peers_desired)} should be)")
                else:
                    state.take_lease(mode, group)
            if waiting_for is None:
                removed = remove_from_router(router, url)
                how = (f"lease taken; {', '.join(healthy_peers(workers, mode, url))} keep serving"
                       if rolling else "no other group of its mode to keep serving"
                       if group in desired else "leaving the config")
                log(f"{group}: removed {removed} registration(s) of {url} from the router ({how})")
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
    # In-flight requests: the router sends nothing new, the worker finishes what it has.
    deadline = time.monotonic() + args.drain_timeout
    while True:
        running = running_requests(url, router.key)
        if not running:
            log(f"{group}: drained ({'no requests running' if running == 0 else 'not answering'})")
            return 0
        if time.monotonic() >= deadline:
            log(f"{group}: {running} request(s) still running after {args.drain_timeout}s "
                "(router.drainTimeoutSeconds); replacing it anyway")
            return 0
        time.sleep(min(args.interval, 1.0))


def admit(args, router: Router, state: State) -> int:
    group, mode, url = args.group, args.mode, args.url
    start = time.monotonic()
    posted = False
    last = ""
    while True:
        workers = router.workers()
        mine = registered(workers or [], url)
        if any(w.get("is_healthy") for w in mine):
            with state.locked():
                gave_back = state.give_back(mode, group)
            log(f"{group}: admitted, healthy in the router ({url})"
                + (f"; {mode} rollout lease given back" if gave_back else ""))
            return 0
        if workers is not None and not mine and not posted:
            body = worker_body(router, url, mode)
            if args.bootstrap_port is not None:
                body["bootstrap_port"] = args.bootstrap_port
            status, answer = router.call("POST", "/workers", body)
            if status not in (200, 201, 202, 409):
                raise SystemExit(f"router-members: POST /workers for {group} ({url}) answered "
                                 f"HTTP {status}: {answer}")
            posted = True
        elapsed = time.monotonic() - start
        said = ("router not answering" if workers is None
                else "registered, not yet healthy" if mine else "registration queued")
        if elapsed >= args.timeout:
            raise SystemExit(f"router-members: {group} ({url}) not healthy in the router after "
                             f"{elapsed:.0f}s: {said}")
        if said != last:
            log(f"{group}: {said}")
            last = said
        time.sleep(args.interval)


def restore(args, router: Router, state: State) -> int:
    """Register, on a router that has just started, every group that should serve and does not
    hold its mode's lease (out for its replacement: its admission brings it back)."""
    start = time.monotonic()
    while router.workers() is None:
        if time.monotonic() - start >= args.timeout:
            raise SystemExit(f"router-members: the router does not answer after {args.timeout}s")
        time.sleep(args.interval)
    with state.locked():
        out = {mode: held[0] for mode in ("prefill", "decode")
               if (held := state.lease(mode)) is not None}
        registered_urls = {w.get("url") for w in router.workers() or []}
        for group, (mode, url, bootstrap) in sorted(state.members().items()):
            if out.get(mode) == group:
                log(f"{group}: out for its replacement (holds the {mode} lease); its admission "
                    "registers it")
                continue
            if not url or url in registered_urls:
                continue
            body = worker_body(router, url, mode)
            if bootstrap != "-":
                body["bootstrap_port"] = int(bootstrap)
            status, answer = router.call("POST", "/workers", body)
            if status not in (200, 201, 202, 409):
                raise SystemExit(f"router-members: POST /workers for {group} ({url}) answered "
                                 f"HTTP {status}: {answer}")
            log(f"{group}: registration queued ({url})")
    return 0


def ready(args, router: Router) -> int:
    start = time.monotonic()
    last = ""
    while True:
        status, _ = router.call("GET", "/readiness")
        workers = router.workers() or []
        missing = [url for url in args.expect
                   if not any(w.get("is_healthy") for w in registered(workers, url))]
        if status == 200 and not missing:
            log(f"router ready: /readiness 200, {len(args.expect)} group(s) healthy")
            return 0
        said = f"/readiness {status}; not healthy: {', '.join(missing) or 'none'}"
        if time.monotonic() - start >= args.timeout:
            raise SystemExit(f"router-members: router not ready after {args.timeout}s: {said}")
        if said != last:
            log(f"waiting: {said}")
            last = said
        time.sleep(args.interval)


def main() -> int:
    parser = argparse.ArgumentParser(prog="router-members.py")
    parser.add_argument("action", choices=["want", "unwant", "drain", "admit", "ready",
                                           "restore"])
    parser.add_argument("--router", required=True)
    parser.add_argument("--api-key-file", required=True)
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
    args = parser.parse_args()
    state = State(args.state_dir)
    if args.action == "want":
        bootstrap = "-" if args.bootstrap_port is None else str(args.bootstrap_port)
        with open(state.marker(args.group), "w", encoding="utf-8") as stream:
            stream.write(f"{args.mode} {args.url} {bootstrap}\n")
        return 0
    if args.action == "unwant":
        if os.path.exists(state.marker(args.group)):
            os.remove(state.marker(args.group))
        return 0
    router = Router(args.router, args.api_key_file)
    if args.action == "drain":
        return drain(args, router, state)
    if args.action == "admit":
        return admit(args, router, state)
    if args.action == "restore":
        return restore(args, router, state)
    return ready(args, router)


if __name__ == "__main__":
    sys.exit(main())
