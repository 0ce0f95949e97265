#!/usr/bin/env python3
"""The door's router slots, run on the router's node (stdlib only, python3 >= 3.8). The groups'
membership in each slot is router-members.py's.

  want    --slot S                           slot S should serve behind the door (a marker)
  unwant  --slot S                           slot S is leaving (the stack is destroyed)
  drain   --slot S --other O --door-socket F --drain-timeout S
  admit   --slot S --door-socket F [--mini-lb] --router URL
  door-drain --slot S --door-socket F --drain-timeout S     (the other door node's door)
  door-admit --slot S --door-socket F [--mini-lb] --router URL  (the other door node's door)

Common: --router URL (loopback) --api-key-file F --state-dir D --timeout S --interval S.

The slot lease (lease-slot) rolls the slots one at a time, as the rollout lease rolls the groups
of a mode: drain takes it once the other slot is up at the door, sets its own server to drain
there (no new request; HAProxy's runtime API) and waits for its open requests; admit registers
every group, waits for /readiness, sets the server ready, waits until the door's health check
sees it up, and gives the lease back.

With the door on two nodes, the state (markers, leases) stays on the router's node, whose door
drain and admit decide; each door on the other node follows with door-drain (after the router
node's drain: no new request there either, then its open ones finish) and door-admit (before
the router node's admission gives the lease back: the slot is up at both doors first).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# No __pycache__ beside the scripts on the node.
sys.dont_write_bytecode = True
from router_api import (  # noqa: E402
    Door, Router, State, check_stop, common_arguments, fail, log, rank0_answers,
    register_missing, wait_idle, wait_until, watch_for_stop)

SLOT_LEASE = "slot"


def mine_serves(status: str) -> bool:
    # "UP 1/2": one failed check, still sent requests; DRAIN: an earlier drain that did not end.
    return status.startswith("UP") or status == "DRAIN"


def slot_drain(args, state: State) -> int:
    """Before slot S's router goes: once the other slot serves at the door, S takes the slot
    lease, is set to drain there (new requests go to the other), and its open requests finish."""
    door, me, other = Door(args.door_socket), f"slot-{args.slot}", f"slot-{args.other}"
    wanted = os.path.exists(state.slot_marker(args.slot))
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
            raise fail(
                f"{me} not drained after {elapsed:.0f}s: {waiting_for}. {me} "
                "keeps running and serving, untouched; fix the other slot (`kimipd status`, "
                "its log), then `pulumi up` again.")
        if waiting_for != last_said or elapsed - said_at >= 30:
            log(f"{me}: waiting: {waiting_for}")
            last_said, said_at = waiting_for, elapsed
        check_stop(f"waiting: {waiting_for}")
        time.sleep(args.interval)
    wait_drained(args, door, me)
    return 0


def wait_drained(args, door: Door, me: str) -> None:
    """Open requests (streams included) finish through the slot; the door sends it nothing
    new."""
    def open_requests() -> int:
        row = (door.servers() or {}).get(me, {})
        return int(row.get("scur") or 0) + int(row.get("qcur") or 0)

    wait_idle(open_requests, args.drain_timeout, min(args.interval, 0.5),
              lambda _: f"{me}: drained at the door (no open request)",
              lambda current: f"{me}: {current} request(s) still open after "
                              f"{args.drain_timeout}s (router.drainTimeoutSeconds); replacing "
                              "it anyway")


def door_drain(args) -> int:
    """At the other door node's door, after the router node's drain (which took the slot lease
    once the other slot served): slot S set to drain here too, and its open requests here end."""
    door, me = Door(args.door_socket), f"slot-{args.slot}"
    if door.servers() is None:
        log(f"{me}: this door does not answer; nothing to drain")
        return 0
    door.set_state(me, "drain")
    wait_drained(args, door, me)
    return 0


def slot_admit(args, router: Router, state: State) -> int:
    """Slot S's router, new: every group registered and healthy in it (rust), then set ready at
    the door; done when the door's own health check sees it up (the slot lease given back)."""
    door, me = Door(args.door_socket), f"slot-{args.slot}"
    start = time.monotonic()

    def not_ready() -> str | None:
        if args.mini_lb:
            status, _ = router.call("GET", "/health")
            return None if status == 200 else f"/health {status}"
        expected = register_missing(router, state, quiet=True) if router.workers() is not None \
            else []
        status, _ = router.call("GET", "/readiness")
        unhealthy = router.unhealthy(expected)
        # A group whose rank 0 does not answer at all (dead, its node lost) serves in no slot:
        # waiting for it would hold this slot out of the door for nothing.
        missing = [url for url in unhealthy if rank0_answers(url)]
        if status == 200 and not missing:
            gone = sorted(set(unhealthy) - set(missing))
            if gone:
                log(f"{me}: not waiting for {', '.join(gone)}: rank 0 does not answer")
            return None
        return f"/readiness {status}; not healthy: {', '.join(missing) or 'none'}"

    wait_until(not_ready, args.timeout, args.interval,
               lambda why, elapsed: f"{me} ({router.url}) not ready after {elapsed:.0f}s: {why}",
               say=lambda why: log(f"{me}: waiting: {why}"))
    set_ready_until_up(args, door, me, start)
    with state.locked():
        gave_back = state.give_back(SLOT_LEASE, args.slot)
    log(f"{me}: up at the door" + ("; slot lease given back" if gave_back else ""))
    return 0


def set_ready_until_up(args, door: Door, me: str, start: float) -> None:
    """Slot ME set ready at DOOR; done when the door's own health check sees it up."""
    door.set_state(me, "ready")

    def not_up() -> str | None:
        status = (door.servers() or {}).get(me, {}).get("status")
        return None if status == "UP" else str(status)

    wait_until(not_up, max(0.0, args.timeout - (time.monotonic() - start)),
               min(args.interval, 0.2),
               lambda why, _: f"{me} set ready, but the door's health check does not see it up "
                              f"after {args.timeout:.0f}s ({why}; `kimipd logs door` says why)",
               say=lambda _: None)


def door_admit(args, router: Router) -> int:
    """At the other door node's door, before the router node's admission gives the slot lease
    back: once slot S's new router serves (/readiness: a healthy prefill and decode; MiniLB:
    /health), set ready here until this door's check sees it up. Which groups it serves is the
    router node's admission's to check; here it needs only to serve."""
    door, me = Door(args.door_socket), f"slot-{args.slot}"
    start = time.monotonic()
    path = "/health" if args.mini_lb else "/readiness"

    def not_ready() -> str | None:
        status, _ = router.call("GET", path)
        return None if status == 200 else f"{path} {status}"

    wait_until(not_ready, args.timeout, args.interval,
               lambda why, elapsed: f"{me} ({router.url}) not ready after {elapsed:.0f}s: {why}",
               say=lambda why: log(f"{me}: waiting: {why}"))
    set_ready_until_up(args, door, me, start)
    log(f"{me}: up at this door")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="door-slots.py")
    parser.add_argument("action", choices=["want", "unwant", "drain", "admit", "door-drain",
                                           "door-admit"])
    common_arguments(parser)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--other")
    parser.add_argument("--door-socket")
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--mini-lb", action="store_true")
    args = parser.parse_args()
    # The other door node's door holds no state: the router node's decides.
    if args.action == "door-drain":
        return door_drain(args)
    if args.action == "door-admit":
        if len(args.router) != 1:
            parser.error("door-admit needs the slot's own --router")
        return door_admit(args, Router(args.router[0], None))
    state = State(args.state_dir, step=f"door-slots {args.action} slot-{args.slot}")
    watch_for_stop(state)
    if args.action == "want":
        with state.locked():
            if not os.path.exists(state.slot_marker(args.slot)):
                state.forget(slot=args.slot)
            state.mark(state.slot_marker(args.slot), "serving")
        return 0
    if args.action == "unwant":
        with state.locked():
            state.unmark(state.slot_marker(args.slot))
            state.forget(slot=args.slot)
        return 0
    if args.action == "drain":
        return slot_drain(args, state)
    if len(args.router) != 1:
        parser.error("admit needs the slot's own --router")
    return slot_admit(args, Router(args.router[0], args.api_key_file), state)


if __name__ == "__main__":
    sys.exit(main())
