#!/usr/bin/env python3
"""The groups' membership in the rust router (or both door slots), run on the router's node
(stdlib only, python3 >= 3.8). The door's own slots are door-slots.py's.

  want    --group G --mode M --url URL [--bootstrap-port N]
                                             G should serve (a marker the drain and restore read)
  unwant  --group G --mode M --url URL       G is leaving the config (or the stack is destroyed)
  drain   --group G --mode M --url URL --rollout R --drain-timeout S
  admit   --group G --mode M --url URL [--bootstrap-port N] [--contract D]
  ready   --expect URL ...                   /readiness and every URL registered and healthy
  restore                                    a new router: register every group that should
                                             serve and is not out for its replacement

Common: --router URL (loopback; repeated: every slot) --api-key-file F --state-dir D
--timeout S --interval S; behind the door, --slot NAME for each --router (the door's server
name, slot-a) and --door-socket F (router.node's door).

smg 1.13.0's worker API: POST /workers {url, worker_type, bootstrap_port, pairing_protocol}
answers 202 and probes the worker in the background (listed once healthy); GET /workers lists
id, url, worker_type, is_healthy, status, pairing_protocol; DELETE /workers/{id} stops new
requests at once (listed `draining` for 5 s more), and requests already sent finish. There is
no drain flag, so the drain waits for the worker's own count of running requests (SGLang's
/get_load). Every registration carries its group's contract as the pairing protocol, so the
router itself never pairs two contracts (router_api.register).

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

The serving contract (never two in one router): each group's admission records the contract
its containers run (--contract, a digest of what prefill and decode must share: the image, the
model, the node files, the KV settings). A router holds the groups of one contract at a time.
A group of a new contract is registered only with a router that holds none of another; one that
does is emptied of them first, when that costs nothing: without the door (one router) at once
(the outage the preview names), behind the door only a slot that does not serve there or whose
other slot serves. Such a slot is set to drain at router.node's door first, its open requests
end, and it is set ready again once it holds a prefill and a decode of the new contract. A group
of the old contract that is registered with no router of its own contract any more serves
nothing, and drains without a peer. With the door on two nodes the other node's door follows
the slot's pair check (docs/decisions.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.request

# No __pycache__ beside the scripts on the node.
sys.dont_write_bytecode = True
from router_api import (  # noqa: E402
    SGLANG_HEALTH_SECONDS, STUCK_SECONDS, Door, Router, State, check_stop, common_arguments, fail,
    log, rank0_answers,
    one_contract, pairing, rank0_healthy, rank0_refuses, register, register_missing, registered,
    routers_said, wait_idle, wait_until, watch_for_stop, whole)


def healthy_peers(workers: list[dict], mode: str, url: str) -> list[str]:
    return [w["url"] for w in workers
            if w.get("worker_type") == mode and w.get("url") != url and w.get("is_healthy")]


def serves_pairs(workers: list[dict]) -> bool:
    """Whether a router has a healthy prefill and decode: one without serves no request, so a
    group leaving it leaves nothing unserved there."""
    return {w.get("worker_type") for w in workers if w.get("is_healthy")} >= {"prefill",
                                                                             "decode"}


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


# SGLang's resolved server arguments a prefill and a decode must share (its /server_info),
# as config/rules/kv_contract.py checks the flags at preview.
RUNTIME_FIELDS = ("model_path", "served_model_name", "tokenizer_path", "revision", "dtype",
                  "quantization", "kv_cache_dtype", "page_size", "speculative_algorithm",
                  "disaggregation_transfer_backend")


def runtime_contract(url: str, key: str) -> str | None:
    """A digest of what the group at URL runs, from its rank 0's /server_info; None while it
    does not answer it."""
    request = urllib.request.Request(url.rstrip("/") + "/server_info",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            info = json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    facts = {name: None if info.get(name) is None else str(info[name])
             for name in RUNTIME_FIELDS}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:8]


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


def foreign(workers: list[dict], by_url: dict[str, str], contract: str,
            url: str) -> list[dict]:
    """The registrations in a router of groups whose recorded contract is not CONTRACT (the
    group at URL itself aside)."""
    return [w for w in workers if w.get("url") != url
            and by_url.get(w.get("url") or "") not in (None, contract)]


def moved_on(workers: list[dict], state: State, group: str, url: str) -> bool:
    """Whether a router no longer holds GROUP and holds groups of another contract than its."""
    mine = state.contract(group)
    return bool(mine and not registered(workers, url)
                and foreign(workers, state.contracts_by_url(), mine, url))


def door_status(door: Door | None, router: Router) -> str | None:
    """ROUTER's status at router.node's door (UP, DOWN, DRAIN, "UP 1/2", ...); None without a
    door, or when the door does not answer."""
    if door is None or router.slot is None:
        return None
    servers = door.servers()
    return None if servers is None else servers.get(router.slot, {}).get("status", "")


def conversion_refused(door: Door | None, router: Router) -> str | None:
    """Why ROUTER, which holds groups of another contract, may not be emptied of them now; None
    when it may. Without the door there is one router: emptying it is the outage a change of
    contract costs there (the preview says so). Behind the door: when it does not serve there,
    or when another slot does."""
    if door is None or router.slot is None:
        return None
    servers = door.servers()
    if servers is None:
        return "the door does not answer on its admin socket"
    if not servers.get(router.slot, {}).get("status", "").startswith("UP"):
        return None
    if any(name != router.slot and row.get("status", "").startswith("UP")
           for name, row in servers.items()):
        return None
    return f"{router.slot} is the only slot serving at the door"


def door_open_requests(door: Door, slot: str) -> int:
    row = (door.servers() or {}).get(slot, {})
    return int(row.get("scur") or 0) + int(row.get("qcur") or 0)


def convert(args, router: Router, others: list[dict], door: Door | None, state: State,
            contract: str, url: str) -> None:
    """ROUTER emptied of the groups of another contract (OTHERS), behind the door once it is
    drained there, then given every group of CONTRACT admitted so far."""
    name = router.slot or router.url
    with state.locked():
        # Before anything leaves it: from here every restore gives it CONTRACT's groups only.
        state.serve_contract(name, contract, converting=door is not None and router.slot
                             is not None)
    if door is not None and router.slot is not None:
        status = door_status(door, router) or ""
        if status != "MAINT":
            door.set_state(router.slot, "drain")
        wait_idle(lambda: door_open_requests(door, router.slot), args.drain_timeout,
                  min(args.interval, 0.5),
                  lambda _: f"{router.slot}: drained at the door to take contract {contract}",
                  lambda current: f"{router.slot}: {current} request(s) still open at the door "
                                  f"after {args.drain_timeout}s; emptied anyway")
    for worker in others:
        status, body = router.call("DELETE", f"/workers/{worker['id']}")
        if status not in (200, 202, 204, 404):
            raise fail(f"DELETE {router.url}/workers/{worker['id']} ({worker.get('url')}) "
                       f"answered HTTP {status}: {body}")
    log(f"{router.slot or router.url}: removed {len(others)} registration(s) of another "
        f"contract ({', '.join(sorted({w.get('url') or '' for w in others}))}); it serves "
        f"contract {contract} from now on")
    with state.locked():
        out = state.out_for_replacement()
        present = {w.get("url") for w in router.workers() or []}
        for group, (mode, member_url, bootstrap) in sorted(state.members().items()):
            if (member_url and member_url != url and member_url not in present
                    and out.get(mode) != group and state.contract(group) == contract):
                register(router, group, member_url, mode,
                         None if bootstrap == "-" else int(bootstrap), contract)
                log(f"{group}: registered with {router.slot or router.url} (contract "
                    f"{contract})")


def reopen(args, routers: list[Router], door: Door | None, state: State) -> None:
    """Each slot taken out at the door for a change of contract, set ready there again once it
    holds a healthy prefill and decode, all of one contract; done when the door's check sees
    it up."""
    if door is None:
        return
    for router in routers:
        if router.slot is None or state.converting(router.slot) is None:
            continue
        workers = router.workers()
        if workers is None:
            continue
        by_url = state.contracts_by_url()
        modes = {w.get("worker_type") for w in workers if w.get("is_healthy")}
        contracts = {by_url.get(w.get("url") or "") for w in workers} - {None}
        if not {"prefill", "decode"} <= modes or contracts != {state.converting(router.slot)}:
            continue
        door.set_state(router.slot, "ready")
        wait_until(lambda r=router: None if (door_status(door, r) or "").startswith("UP")
                   else str(door_status(door, r)),
                   args.timeout, min(args.interval, 0.2),
                   lambda why, elapsed, r=router: f"{r.slot} set ready at the door, but its "
                                                  f"check does not see it up after "
                                                  f"{elapsed:.0f}s ({why})",
                   say=lambda _: None)
        with state.locked():
            state.serve_contract(router.slot, next(iter(contracts)))
        log(f"{router.slot}: up at the door again, serving contract "
            f"{', '.join(sorted(contracts)) or '(none recorded)'}")


def standby_contract(state: State, group: str, key: str) -> str | None:
    """A contract other than GROUP's whose groups that should serve (none out for its
    replacement) have a prefill and a decode, each answering /health: the one a rollout
    reverted midway goes back to. None when there is none."""
    mine = state.contract(group)
    out = state.out_for_replacement()
    contracts = state.contracts()
    modes = {g: fields[0] for g, fields in state.members().items()
             if g != group and out.get(fields[0]) != g and fields[1]
             and contracts[g] != mine and rank0_healthy(fields[1], key)}
    choice = one_contract(modes, contracts, state.target_contract())
    return choice if choice is not None and whole(choice, modes, contracts) else None


def drain(args, routers: list[Router], state: State) -> int:
    group, mode, url = args.group, args.mode, args.url
    door = Door(args.door_socket) if getattr(args, "door_socket", None) else None
    desired = state.desired()
    peers_desired = sorted(g for g, m in desired.items() if m == mode and g != group)
    rolling = args.rollout == "one-group-at-a-time" and group in desired and peers_desired
    start = time.monotonic()
    # The wait is bounded per reason, not in total: with three groups of a mode the last one
    # waits for two replacements, each of which may take up to the gate timeout.
    last_said, said_at, reason_since = "", 0.0, start
    idle: str | None = None
    # What the routers hold: a change is progress (a change of contract moves the groups of
    # the other half between the slots while this one waits for its peer), and starts the
    # bound again.
    registrations: frozenset[tuple[str, str]] = frozenset()
    while True:
        with state.locked():
            live = answering(routers)
            held_now = frozenset((router.url, str(w.get("url"))) for router, workers in live
                                 for w in workers)
            if not live and not rolling:
                log(f"{group}: no router answers GET /workers; nothing to drain")
                return 0
            held = state.lease(mode)
            waiting_for, holder_out = None, False
            handover_to = None
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
                # Every router that serves this group's contract keeps a healthy group of this
                # mode; one that serves another contract only (the rollout of a new one has
                # moved it on) is none of this group's business.
                lonely = [router.url for router, workers in live
                          if serves_pairs(workers) and not healthy_peers(workers, mode, url)
                          and not moved_on(workers, state, group, url)]
                if holder_out:
                    waiting_for = (f"{held[0]} holds the {mode} rollout lease (drained "
                                   f"{time.time() - held[1]:.0f}s ago for its replacement, not "
                                   "yet re-admitted)")
                elif lonely:
                    waiting_for = (f"no other {mode} group is registered and healthy in "
                                   f"{', '.join(lonely)} ({', '.join(peers_desired)} should be)")
                    standby = standby_contract(state, group, routers[0].key)
                    handover = next(((router, workers) for router, workers in live
                                     if router.url in lonely
                                     and conversion_refused(door, router) is None), None)
                    if standby is not None and handover is not None:
                        handover_to = (handover[0], handover[1], standby)
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
        if handover_to is not None:
            # A rollout reverted or taken back midway: this group is the last of its mode in a
            # slot, and another contract has a whole, healthy pair that serves nowhere. The
            # slot takes that one (out at the door first, while another slot serves), so this
            # group leaves no slot without a pair.
            router, workers, standby = handover_to
            log(f"{group}: the last {mode} group of its contract in {router.slot or router.url};"
                f" contract {standby} has a whole pair serving nowhere: that slot takes it")
            convert(args, router, foreign(workers, state.contracts_by_url(), standby, ""), door,
                    state, standby, "")
            reopen(args, routers, door, state)
            continue
        now = time.monotonic()
        elapsed = now - start
        reason = waiting_for.split(" (")[0]
        if reason != last_said or held_now != registrations:
            reason_since = now
        registrations = held_now
        # Waiting this long for one holder (or one missing peer), with nothing registered or
        # removed meanwhile: its gate has failed by now.
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
        check_stop(f"waiting: {waiting_for}")
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
              stuck=lambda: not rank0_healthy(url, key, args.health_seconds),
              given_up=lambda running: f"{group}: {running} request(s) stuck: its rank 0's "
                                       f"/health failed for {STUCK_SECONDS:.0f}s in a row (a hung "
                                       "group finishes none); replacing it without waiting out "
                                       "router.drainTimeoutSeconds")
    return 0




def register_if_one_contract(router: Router, state: State, group: str, url: str, mode: str,
                             bootstrap: int | None) -> bool:
    """GROUP registered with ROUTER unless the router holds a group of another contract now
    (read again under the state lock, under which every restore registers too) or is out at the
    door to take another one; whether it was."""
    name = router.slot or router.url
    with state.locked():
        mine = state.contract(group)
        taking = state.converting(name)
        others = foreign(router.workers() or [], state.contracts_by_url(), mine, url)
        if others or (taking is not None and taking != mine):
            log(f"{group}: not registered with {name}: it "
                + (f"is out at the door to take contract {taking}" if not others else
                   f"holds {', '.join(sorted(w.get('url') or '' for w in others))} of "
                   "another contract"))
            return False
        register(router, group, url, mode, bootstrap, mine, settle=True)
        if taking is None and state.slot_contract(name) != mine:
            state.serve_contract(name, mine)
    return True


def admit(args, routers: list[Router], state: State) -> int:
    """Registered and healthy in every router (slot) of its contract. One that does not answer
    is waited for a grace (a slot replaced meanwhile skipped this group in its restore); one
    silent for longer is dead, and gets the group from its own restore once it is replaced. One
    that holds another contract is emptied of it first where that costs nothing (`convert`), or
    left to a later admission."""
    group, mode, url, contract = args.group, args.mode, args.url, args.contract
    door = Door(args.door_socket) if args.door_socket else None
    if contract:
        # What the group really runs, as SGLang resolved it (a backend that snaps the page size,
        # a dtype left to "auto"), is part of its contract: two groups admitted under one
        # config but resolved apart are kept apart like two contracts.
        key = routers[0].key if routers else ""
        resolved = {"digest": ""}

        def unread() -> str | None:
            resolved["digest"] = runtime_contract(url, key) or ""
            return None if resolved["digest"] else "its rank 0's /server_info does not answer"

        wait_until(unread, args.timeout, args.interval,
                   lambda why, elapsed: f"{group} ({url}): {why} after {elapsed:.0f}s",
                   say=lambda why: log(f"{group}: {why}"))
        contract = f"{contract}.{resolved['digest']}"
        with state.locked():
            state.record_contract(group, contract)
    posted: set[str] = set()
    silent_since: dict[str, float] = {}
    held_back: dict[str, str] = {}
    # Within the gate's timeout, so that a dead slot delays the admission but never fails it.
    grace = min(args.silent_grace, args.timeout / 2)

    def not_yet() -> str | None:
        if contract:
            reopen(args, routers, door, state)
        live = answering(routers)
        now = time.monotonic()
        for router in routers:
            if any(router is answered for answered, _ in live):
                silent_since.pop(router.url, None)
            else:
                silent_since.setdefault(router.url, now)
        awaited = sorted(u for u, since in silent_since.items()
                         if now - since < grace)
        held_back.clear()
        if contract:
            converted = False
            by_url = state.contracts_by_url()
            for router, workers in live:
                others = foreign(workers, by_url, contract, url)
                # Out at the door to take another contract (a rollout reverted midway): it
                # serves nothing, and takes this one instead.
                if not others and state.converting(router.slot or router.url) in (None,
                                                                                   contract):
                    continue
                refused = conversion_refused(door, router)
                if refused is None:
                    convert(args, router, others, door, state, contract, url)
                    converted = True
                else:
                    held_back[router.url] = (f"{router.slot or router.url} holds another "
                                             f"contract and stays: {refused}")
            if converted:
                live = answering(routers)
        eligible = [(router, workers) for router, workers in live
                    if router.url not in held_back]
        # A registration of another pairing protocol (a restore's, made before this group's
        # contract was recorded) is not this admission's: it is registered again, as its own.
        mine = {router.url: [w for w in registered(workers, url)
                             if not contract or pairing(w) == contract]
                for router, workers in eligible}
        if eligible and all(any(w.get("is_healthy") for w in found) for found in mine.values()):
            if not awaited:
                return None
        for router, _ in eligible:
            if not mine[router.url] and router.url not in posted:
                if register_if_one_contract(router, state, group, url, mode,
                                            args.bootstrap_port):
                    posted.add(router.url)
        if live and not eligible:
            return "; ".join(held_back.values())
        if eligible and awaited and all(mine.values()):
            return (f"{', '.join(awaited)} does not answer: waiting up to "
                    f"{grace:g}s to register there too")
        return ("no router answers" if not live
                else "registered, not yet healthy" if all(mine.values())
                else "registration queued")

    while True:
        wait_until(not_yet, args.timeout, args.interval,
                   lambda why, elapsed: f"{group} ({url}) not healthy in the router after "
                                        f"{elapsed:.0f}s: {why}",
                   say=lambda why: log(f"{group}: {why}"))
        if not contract:
            break
        # This admission may have made a converted slot whole: up at the door again, it lets
        # the slot still holding the old contract move on now, not at the next admission.
        reopen(args, routers, door, state)
        if all(conversion_refused(door, router) is not None
               for router in routers if router.url in held_back):
            break
    for silent in sorted(silent_since):
        log(f"{group}: {silent} has not answered for {grace:g}s: admitted without "
            "it; its restore registers the group when it is replaced")
    for why in held_back.values():
        log(f"{group}: not registered where another contract serves alone ({why}); the next "
            "admission of its contract moves that slot on")
    with state.locked():
        gave_back = state.give_back(mode, group)
    log(f"{group}: admitted, healthy in {routers_said(len(answering(routers)) - len(held_back))}"
        f" ({url})" + (f"; {mode} rollout lease given back" if gave_back else ""))
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
                                           "restore", "stop"])
    common_arguments(parser)
    parser.add_argument("--group")
    parser.add_argument("--mode", choices=["prefill", "decode"])
    parser.add_argument("--url")
    parser.add_argument("--bootstrap-port", type=int)
    parser.add_argument("--rollout", choices=["one-group-at-a-time", "all-at-once"],
                        default="one-group-at-a-time")
    parser.add_argument("--drain-timeout", type=float, default=600)
    # How long the group's rank 0 may take to answer /health and be healthy, as SGLang judges
    # it (1 s + SGLANG_HEALTH_CHECK_TIMEOUT): rendered from the group's env.
    parser.add_argument("--health-seconds", type=float, default=SGLANG_HEALTH_SECONDS)
    parser.add_argument("--expect", action="append", default=[])
    parser.add_argument("--silent-grace", type=float, default=60)
    parser.add_argument("--contract")
    parser.add_argument("--slot", action="append", default=[],
                        help="the door's server name of each --router, in their order")
    parser.add_argument("--door-socket")
    args = parser.parse_args()
    if args.slot and len(args.slot) != len(args.router):
        parser.error("--slot names each --router: give as many of each")
    state = State(args.state_dir, step=" ".join(
        ["router-members", args.action] + ([args.group] if args.group else [])))
    watch_for_stop(state)
    if args.action == "stop":
        with state.locked():
            state.request_stop()
        log(f"stop asked: the waits of every update's node script running now end "
            f"(phase {state.phase()})")
        return 0
    if args.action == "want":
        bootstrap = "-" if args.bootstrap_port is None else str(args.bootstrap_port)
        with state.locked():
            if not os.path.exists(state.marker(args.group)):
                state.forget(group=args.group)
            state.mark(state.marker(args.group), f"{args.mode} {args.url} {bootstrap}")
        return 0
    if args.action == "unwant":
        with state.locked():
            state.unmark(state.marker(args.group))
            state.forget(group=args.group)
        return 0
    slots = args.slot or [None] * len(args.router)
    routers = [Router(url, args.api_key_file, slot) for url, slot in zip(args.router, slots)]
    if not routers:
        parser.error(f"{args.action} needs --router")
    actions = {"drain": drain, "admit": admit, "restore": restore}
    if args.action in actions:
        return actions[args.action](args, routers, state)
    return ready(args, routers)


if __name__ == "__main__":
    sys.exit(main())
