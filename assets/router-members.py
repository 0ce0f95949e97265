#!/usr/bin/env python3
"""The groups' membership in the rust router (or both door slots), run on the router's node
(stdlib only, python3 >= 3.8). The door's own slots are door-slots.py's.

  want    --group G --mode M --url URL [--bootstrap-port N]
                                             G should serve (a marker the drain and restore read)
  unwant  --group G --mode M --url URL       G is leaving the config (or the stack is destroyed)
  drain   --group G --mode M --url URL --rollout R --drain-timeout S
  admit   --group G --mode M --url URL [--bootstrap-port N]
  ready   --expect URL ...                   /readiness and every URL registered and healthy
  restore                                    a new router: register every group that should
                                             serve and is not out for its replacement

Common: --router URL (loopback; repeated: every slot) --api-key-file F --state-dir D
--timeout S --interval S.

sglang-router 0.3.2's worker API: POST /workers {url, worker_type, bootstrap_port} queues a job
that probes the worker until healthy; GET /workers lists id, url, worker_type, is_healthy; DELETE
/workers/{id} stops new requests at once, and requests already sent finish. There is no drain
flag, so the drain waits for the worker's own count of running requests (SGLang's /get_load).

The rollout lease (one-group-at-a-time): a group is removed from the router only while another
group of its mode is registered and healthy, and only one group per mode is out at a time: its
drain writes lease-MODE, its admission removes it. Under a file lock, so two drains that start
together cannot both see the other as the healthy one. A group that serves nothing (its rank 0
refuses, or answers nothing and is healthy nowhere) is drained without the lease: when every
group of a mode is dead, all are replaced at once.

A replaced router starts with no worker; `restore` gives it at once every group that is running
and not drained (the markers name them), so a change that replaces the router and every group
(an image, restartGeneration) still rolls the groups behind a router that serves. With the door
there are two routers, the slots, and a group is registered with both: drain removes it from
every slot that answers, once each of them has a healthy peer; admit registers it with every
slot, waiting --silent-grace (60 s) for one that does not answer: a slot replaced meanwhile
skips the group in its restore (out for its replacement), so only this admission gives it back.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

# No __pycache__ beside the scripts on the node.
sys.dont_write_bytecode = True
from router_api import (  # noqa: E402
    STUCK_SECONDS, Router, State, common_arguments, fail, log, rank0_answers, rank0_healthy,
    rank0_refuses, register, register_missing, registered, routers_said, wait_idle, wait_until)


def healthy_peers(workers: list[dict], mode: str, url: str) -> list[str]:
    return [w["url"] for w in workers
            if w.get("worker_type") == mode and w.get("url") != url and w.get("is_healthy")]


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


def remove_from_router(router: Router, url: str) -> int:
    """DELETE every registration of URL; how many there were."""
    workers = router.workers() or []
    for worker in registered(workers, url):
        status, body = router.call("DELETE", f"/workers/{worker['id']}")
        if status not in (200, 202, 204, 404):
            raise fail(f"DELETE {router.url}/workers/{worker['id']} ({url}) answered HTTP "
                       f"{status}: {body}")
    return len(registered(workers, url))


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
            raise fail(
                f"{group} ({mode}) not drained after {elapsed:.0f}s: "
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
    # A hung group (its /health failing) finishes none of them: not waited for.
    wait_idle(lambda: running_requests(url, key), args.drain_timeout, min(args.interval, 1.0),
              lambda running: f"{group}: drained "
                              f"({'no requests running' if running == 0 else 'not answering'})",
              lambda running: f"{group}: {running} request(s) still running after "
                              f"{args.drain_timeout}s (router.drainTimeoutSeconds); replacing "
                              "it anyway",
              stuck=lambda: not rank0_healthy(url, key),
              given_up=lambda running: f"{group}: {running} request(s) stuck: its rank 0's "
                                       f"/health failed for {STUCK_SECONDS:.0f}s in a row (a hung "
                                       "group finishes none); replacing it without waiting out "
                                       "router.drainTimeoutSeconds")
    return 0




def admit(args, routers: list[Router], state: State) -> int:
    """Registered and healthy in every router (slot). One that does not answer is waited for a
    grace (a slot replaced meanwhile skipped this group in its restore); one silent for longer
    is dead, and gets the group from its own restore once it is replaced."""
    group, mode, url = args.group, args.mode, args.url
    posted: set[str] = set()
    silent_since: dict[str, float] = {}
    # Within the gate's timeout, so that a dead slot delays the admission but never fails it.
    grace = min(args.silent_grace, args.timeout / 2)

    def not_yet() -> str | None:
        live = answering(routers)
        now = time.monotonic()
        for router in routers:
            if any(router is answered for answered, _ in live):
                silent_since.pop(router.url, None)
            else:
                silent_since.setdefault(router.url, now)
        awaited = sorted(u for u, since in silent_since.items()
                         if now - since < grace)
        mine = {router.url: registered(workers, url) for router, workers in live}
        if live and all(any(w.get("is_healthy") for w in found) for found in mine.values()):
            if not awaited:
                return None
        for router, _ in live:
            if not mine[router.url] and router.url not in posted:
                register(router, group, url, mode, args.bootstrap_port)
                posted.add(router.url)
        if live and awaited and all(mine.values()):
            return (f"{', '.join(awaited)} does not answer: waiting up to "
                    f"{grace:g}s to register there too")
        return ("no router answers" if not live
                else "registered, not yet healthy" if all(mine.values())
                else "registration queued")

    wait_until(not_yet, args.timeout, args.interval,
               lambda why, elapsed: f"{group} ({url}) not healthy in the router after "
                                    f"{elapsed:.0f}s: {why}",
               say=lambda why: log(f"{group}: {why}"))
    for silent in sorted(silent_since):
        log(f"{group}: {silent} has not answered for {grace:g}s: admitted without "
            "it; its restore registers the group when it is replaced")
    with state.locked():
        gave_back = state.give_back(mode, group)
    log(f"{group}: admitted, healthy in {routers_said(len(answering(routers)))} ({url})"
        + (f"; {mode} rollout lease given back" if gave_back else ""))
    return 0


def restore(args, routers: list[Router], state: State) -> int:
    """Register, on a router that has just started, every group that should serve and does not
    hold its mode's lease (out for its replacement: its admission brings it back)."""
    for router in routers:
        wait_until(lambda r=router: None if r.workers() is not None else "not answering",
                   args.timeout, args.interval,
                   lambda _, elapsed, r=router: f"{r.url} does not answer after {elapsed:.0f}s",
                   say=lambda _: None)
        register_missing(router, state)
    return 0


def ready(args, routers: list[Router]) -> int:
    def not_yet() -> str | None:
        problems = []
        for router in routers:
            status, _ = router.call("GET", "/readiness")
            missing = router.unhealthy(args.expect)
            if status != 200 or missing:
                problems.append(f"{router.url}: /readiness {status}; not healthy: "
                                f"{', '.join(missing) or 'none'}")
        return "; ".join(problems) or None

    wait_until(not_yet, args.timeout, args.interval,
               lambda why, elapsed: f"router not ready after {elapsed:.0f}s: {why}",
               say=lambda why: log(f"waiting: {why}"))
    log(f"router ready: /readiness 200, {len(args.expect)} group(s) healthy"
        + ("" if len(routers) == 1 else f" in {routers_said(len(routers))}"))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="router-members.py")
    parser.add_argument("action", choices=["want", "unwant", "drain", "admit", "ready",
                                           "restore"])
    common_arguments(parser)
    parser.add_argument("--group")
    parser.add_argument("--mode", choices=["prefill", "decode"])
    parser.add_argument("--url")
    parser.add_argument("--bootstrap-port", type=int)
    parser.add_argument("--rollout", choices=["one-group-at-a-time", "all-at-once"],
                        default="one-group-at-a-time")
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--expect", action="append", default=[])
    parser.add_argument("--silent-grace", type=float, default=60)
    args = parser.parse_args()
    state = State(args.state_dir)
    if args.action == "want":
        bootstrap = "-" if args.bootstrap_port is None else str(args.bootstrap_port)
        state.mark(state.marker(args.group), f"{args.mode} {args.url} {bootstrap}")
        return 0
    if args.action == "unwant":
        state.unmark(state.marker(args.group))
        return 0
    routers = [Router(url, args.api_key_file) for url in args.router]
    if not routers:
        parser.error(f"{args.action} needs --router")
    actions = {"drain": drain, "admit": admit, "restore": restore}
    if args.action in actions:
        return actions[args.action](args, routers, state)
    return ready(args, routers)


if __name__ == "__main__":
    sys.exit(main())
