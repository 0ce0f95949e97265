"""`kimipd status`: every container's docker state (over SSH) and health (its healthUrl), and one
1-token /generate through the router for the whole path. Probes run in parallel, each bounded
by its timeout: a dead node costs its own rows, never the table.

With the door (the `door` output): the door's port, each slot's readiness and state at the door
(HAProxy's runtime API, over SSH on the router's node), and where each group stands in each
slot (registered, healthy, load: the slot's GET /workers). With the door on two nodes, each
door's view of both slots (each checks them on its own), which node holds the virtual IP and
each keepalived's state (ops/virtual_ip.py); two holders or none is down, and so is a holder
whose door sends to no slot."""

from __future__ import annotations

import json
import shlex
import ssl
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone

from components.config.router_schema import DEFAULT_ROUTER_KIND
from components.render import GENERATION_LABEL, firewall_urn

from . import DEGRADED, DOWN, OK, rollout
from .door import DoorProbes
from .firewall_probe import firewall_on_node
from .probe import HttpAnswer, Prober, Tls, settled, tls_check
from .remote import SLOW_NODE_FACTOR, CommandTimeout, RemoteError, Transport, run_patiently
from .stack import Stack
from .topology import ContainerRef, Topology
from .verdict import (
    Docker,
    HungUnit,
    Report,
    Row,
    container_state,
    hung_units,
    loading_units,
    lost_nodes,
    problems,
)
from .virtual_ip import VirtualIpProbes

# The whole path: one token through the router (prefill, KV hand-off, decode).
PATH_PROBE_BODY = {"text": "ping", "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}


def inspect_node(transport: Transport, node: str, names: list[str],
                 timeout: float) -> dict[str, Docker]:
    """`docker inspect` of this node's containers in one command; a missing one is "absent"."""
    command = shlex.join(["docker", "inspect", "--type", "container", *names])
    try:
        # SSH answered: a docker engine busy starting containers can take longer than a probe's
        # timeout, so one more try with a longer one before calling it unknown.
        result = run_patiently(transport, node, command, timeout)
    except CommandTimeout as error:
        return {name: Docker("unknown", error="docker: " + str(error)) for name in names}
    except RemoteError as error:
        return {name: Docker("unknown", error=str(error)) for name in names}
    try:
        # `docker inspect` always prints a JSON array, `[]` when it found none of them.
        found = json.loads(result.out)
    except json.JSONDecodeError:
        # An answer cut short (an SSH channel closed under load) says nothing of the containers:
        # read as "absent", a hung unit's heal once replaced nothing for containers that ran.
        return {name: Docker("unknown", error="docker inspect gave no JSON: "
                             + (result.err.strip() or result.out.strip() or "no output")[:200])
                for name in names}
    by_name = {item.get("Name", "").lstrip("/"): item for item in found}
    answers = {}
    for name in names:
        item = by_name.get(name)
        if item is None:
            if result.status != 0 and "No such" not in result.err:
                # docker itself failed (daemon down): not the same as a removed container
                answers[name] = Docker("unknown", error="docker: " + result.err.strip()[:200])
            else:
                answers[name] = Docker("absent")
            continue
        state = item.get("State") or {}
        labels = (item.get("Config") or {}).get("Labels") or {}
        answers[name] = Docker(state.get("Status", "unknown"), state.get("ExitCode"),
                               state.get("StartedAt"), state.get("FinishedAt"),
                               labels.get(GENERATION_LABEL))
    return answers


def door_tls(stack: Stack) -> Tls | None:
    """How the door's certificate is checked from here: against router.door.tls of the config
    when it is at hand (the CA is not among the outputs), else not at all. None: no TLS door."""
    door = stack.topology.door
    if door is None or not door.tls:
        return None
    config = stack.door_tls
    try:
        return tls_check(config.ca_certificate if config else None,
                         config.certificate if config else None)
    except ssl.SSLError as error:
        unverified = tls_check(None, None)
        return Tls(unverified.context, f"not verified (router.door.tls does not load: {error})")


# On top of how long a group's rank 0 may take to answer /health (GroupOutput.health_seconds):
# the network, a loaded node.
HEALTH_MARGIN_SECONDS = 4.0


def health_timeout(topology: Topology, ref: ContainerRef, timeout: float) -> float:
    """A group's rank 0 is given as long as SGLang gives its /health (a busy group answers late
    and is healthy; a hung one answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT); every other
    container, TIMEOUT (status --timeout)."""
    group = topology.groups.get(ref.group) if ref.group is not None and ref.rank == 0 else None
    if group is None:
        return timeout
    return max(timeout, group.health_seconds + HEALTH_MARGIN_SECONDS)


def collect(topology: Topology, transport: Transport, prober: Prober, timeout: float,
            generate_timeout: float, api_key: str | None = None,
            router_kind: str = DEFAULT_ROUTER_KIND) -> Report:
    """API_KEY: the rust router's (the routerApiKey secret), sent with the whole-path probe and,
    with the door, each slot's GET /workers. ROUTER_KIND (router.kind of the config): what the
    door asks a slot, and whether a slot has a worker API."""
    now = datetime.now(timezone.utc)
    if not topology.serving or not topology.containers:
        reason = ("serving is false: no container is meant to run" if not topology.serving
                  else "the stack has no `containers` output (never deployed?)")
        return Report(topology.stack, now, topology.serving, [], None, DOWN, "down", [reason])
    by_node: dict[str, list[str]] = {}
    for ref in topology.containers:
        by_node.setdefault(ref.node, []).append(ref.name)
    pool = ThreadPoolExecutor(max_workers=min(64, 2 * len(topology.containers) + 2),
                              thread_name_prefix="kimipd-probe")
    try:
        inspections: dict[str, Future] = {
            node: pool.submit(inspect_node, transport, node, names, timeout)
            for node, names in by_node.items()}
        health: dict[str, Future] = {
            ref.role: pool.submit(prober.request, "GET", ref.health_url, ref.node,
                                  timeout=health_timeout(topology, ref, timeout))
            for ref in topology.containers}
        tables: dict[str, Future] = {
            node: pool.submit(firewall_on_node, transport, node, topology.firewall_table, timeout)
            for node in topology.nodes} if topology.firewall_table else {}
        path: Future | None = None
        if topology.generate_url:
            router = topology.router
            node = (topology.door.node if topology.door else router.node if router
                    else topology.containers[-1].node)
            path = pool.submit(prober.request, "POST", topology.generate_url, node,
                               PATH_PROBE_BODY, generate_timeout, api_key)
        door = (DoorProbes(topology.door, topology.groups, transport, prober, timeout, api_key,
                           router_kind) if topology.door else None)
        door_futures = door.submit(pool) if door else []
        vip = (VirtualIpProbes(topology.door, transport, timeout)
               if topology.door is not None and topology.door.virtual_ip is not None else None)
        door_futures += vip.submit(pool) if vip else []
        record = (pool.submit(rollout.read, transport, topology.door, timeout)
                  if topology.door is not None else None)
        # A probe is bounded by its timeout (direct, then over SSH: connect + command); this is
        # the backstop for one that is not.
        everything = [*inspections.values(), *health.values(), *tables.values(),
                      *([path] if path else []), *door_futures, *([record] if record else [])]
        longest_health = max(health_timeout(topology, ref, timeout) for ref in topology.containers)
        # A read-only probe may be asked twice (ops.remote.run_patiently): its second, longer
        # ask is waited for too; SSH's own time is 5 s on top of each.
        patient = (1 + SLOW_NODE_FACTOR) * (max(timeout, longest_health) + 5)
        wait(everything, timeout=max(patient, generate_timeout + 5) + 10)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)

    rows = []
    for ref in topology.containers:
        dockers = settled(inspections[ref.node], {})
        docker = dockers.get(ref.name) or Docker("unknown", error="docker inspect timed out")
        answer = settled(health[ref.role], HttpAnswer(ref.health_url, "-", error="timed out"))
        row = Row(ref, docker, answer)
        row.problems = problems(row, topology.restart_generation)
        rows.append(row)
    path_answer = (settled(path, HttpAnswer(topology.generate_url, "-", error="timed out"))
                   if path is not None and topology.generate_url else None)

    firewall = {node: settled(future, "unknown: timed out") for node, future in tables.items()}
    missing = [node for node, state in firewall.items() if state == "missing"]
    door_report = None
    containers = {row.ref.role: container_state(row.docker) for row in rows}
    if door is not None:
        verification = (prober.tls.verification if prober.tls is not None
                        else "verified against the system's trust store")
        door_report = door.report(containers, verification)
    vip_report = vip.report(containers) if vip is not None else None
    notes = []
    if path_answer is None:
        notes.append("no generateUrl output: the whole path was not probed")
    for node in missing:
        notes.append(
            f"firewall: table {topology.firewall_table} is missing on {node}, so any host "
            "reaches every port there; put it back: pulumi up --replace "
            f"'{firewall_urn(topology.stack, node)}'")
    unreachable = sorted({row.ref.node for row in rows if row.docker.state == "unknown"})
    nothing_answered = (len(unreachable) == len(by_node)
                        and not any(row.health.status is not None for row in rows)
                        and not (path_answer and path_answer.status is not None))
    if nothing_answered:
        exit_code, verdict = DOWN, "unreachable"
        notes.append("no node answered over SSH and no HTTP probe got an answer")
    elif vip_report is not None and vip_report.down is not None:
        exit_code, verdict = DOWN, "down"
        notes.append(vip_report.down)
    elif (door_report is not None and vip_report is not None and len(vip_report.holders) == 1
          and door_report.serving_at(vip_report.holders[0]) == []):
        exit_code, verdict = DOWN, "down"
        notes.append(f"no slot serves at the door on {vip_report.holders[0]}, which holds the "
                     "virtual IP: every request fails")
    elif door_report is not None and not (door_report.open and door_report.serving_slots):
        exit_code, verdict = DOWN, "down"
        notes.append("the door does not take connections: no request gets in" if not
                     door_report.open else "no slot serves at the door: every request fails")
    elif (all(row.ok for row in rows) and path_answer is not None and path_answer.ok
          and not missing and (door_report is None or door_report.ok)
          and (vip_report is None or vip_report.ok)):
        exit_code, verdict = OK, "serving"
    else:
        exit_code, verdict = DEGRADED, "degraded"
    loading, overdue = loading_units(
        rows, {name: group.load_bound_seconds for name, group in topology.groups.items()}, now)
    notes += [f"{unit} hung: {why}" for unit, why in overdue.items()]
    hung = [HungUnit(unit, [f"{name}@{node}" for node, name in containers])
            for unit, containers in sorted(
                hung_units(rows, {unit.unit for unit in loading}).items())]
    return Report(topology.stack, now, True, rows, path_answer, exit_code, verdict, notes,
                  firewall, door_report, lost_nodes(rows), vip_report, hung,
                  settled(record, "the rollout's record: timed out") if record else None,
                  loading)
