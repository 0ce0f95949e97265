"""`kimipd status`'s table: a Report (ops/status.py) rendered for the terminal, nothing
collected here."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .door import AtDoor, DoorReport, serving_at_door
from .probe import HttpAnswer
from .verdict import Docker, Report, duration, uptime_seconds
from .virtual_ip import VirtualIpReport


def _state_text(docker: Docker) -> Text:
    if docker.state == "running":
        return Text("running", style="green")
    if docker.state in ("exited", "dead"):
        return Text(f"{docker.state} ({docker.exit_code})", style="red")
    return Text(docker.state, style="yellow" if docker.state == "unknown" else "red")


def _health_text(answer: HttpAnswer) -> Text:
    if answer.status is None:
        return Text(answer.error or "no answer", style="red")
    latency = f" {answer.seconds * 1000:.0f}ms" if answer.seconds is not None else ""
    return Text(f"{answer.status}{latency}", style="green" if answer.ok else "red")


def _container_text(state: str) -> Text:
    return Text(state, style="green" if state == "running" else
                "yellow" if state == "unknown" else "red")


def _at_door_text(state: str | None, error: str | None) -> Text:
    if state is None:
        return Text("-" if error is None else "unknown", style="yellow")
    return Text(state, style="green" if serving_at_door(state) else "red")


def _at_doors_text(view: AtDoor, error: str | None) -> Text:
    """One door's view of one slot in a cell: `UP, 0 in flight, L7OK, 5m02s`."""
    if view.state is None:
        return _at_door_text(None, error)
    details = [f"{view.sessions} in flight" if view.sessions is not None else None, view.check,
               duration(view.since_change) if view.since_change is not None else None]
    return Text.assemble(_at_door_text(view.state, error),
                         "".join(f", {detail}" for detail in details if detail))


def _door_lines(door: DoorReport) -> list[Any]:
    scheme = f"TLS, {door.tls_verification}" if door.tls else "plain HTTP"
    serving = door.serving_slots
    if door.doors:
        where: list[Any] = [f"{door.url} ({scheme}) on "]
        for index, (node, state) in enumerate(door.doors.items()):
            where += [", " if index else "", f"{node} (", _container_text(state), ")"]
    else:
        where = [f"{door.url} ({scheme}) on {door.node}: container ",
                 _container_text(door.container)]
    lines: list[Any] = [Text.assemble(
        ("door ", "bold"), *where, "; GET /health ", _health_text(door.answer),
        f" via {door.answer.via}; serving slots: ",
        (", ".join(slot.name for slot in serving) or "none",
         "green" if len(serving) == len(door.slots) else "red" if not serving else "yellow"))]
    slots = Table(show_edge=False, pad_edge=False)
    if door.doors:
        # Each door checks both slots on its own: a column per door node.
        for column in ("slot", "role", "url", "container", "ready",
                       *(f"at the door on {node}" for node in door.doors), "verdict"):
            slots.add_column(column, no_wrap=column != "verdict")
        for slot in door.slots:
            slots.add_row(
                slot.name, slot.role, slot.url, _container_text(slot.container),
                _health_text(slot.readiness),
                *(_at_doors_text(slot.at_doors.get(node, AtDoor()),
                                 door.stat_errors.get(node)) for node in door.doors),
                Text("ok", style="green") if not slot.problems
                else Text("; ".join(slot.problems), style="red"))
    else:
        for column in ("slot", "role", "url", "container", "ready", "at door", "in flight",
                       "check", "since", "verdict"):
            slots.add_column(column, no_wrap=column != "verdict")
        for slot in door.slots:
            slots.add_row(
                slot.name, slot.role, slot.url, _container_text(slot.container),
                _health_text(slot.readiness), _at_door_text(slot.at_door, door.stat_error),
                "-" if slot.sessions is None else str(slot.sessions), slot.check or "-",
                duration(slot.since_change),
                Text("ok", style="green") if not slot.problems
                else Text("; ".join(slot.problems), style="red"))
    lines.append(slots)
    asked = [slot for slot in door.slots if slot.members is not None]
    if asked:
        groups = Table(show_edge=False, pad_edge=False)
        groups.add_column("group", no_wrap=True)
        groups.add_column("mode", no_wrap=True)
        for slot in door.slots:
            groups.add_column(f"in slot {slot.name}", no_wrap=True)
        names = list(dict.fromkeys(m.group for slot in asked for m in slot.members or []))
        for name in names:
            cells: list[Any] = []
            mode = "-"
            for slot in door.slots:
                member = next((m for m in slot.members or [] if m.group == name), None)
                if member is None:
                    cells.append(Text(slot.members_error or "-", style="yellow"))
                    continue
                mode = member.mode or mode
                good = member.registered and member.healthy
                cells.append(Text(member.summary(), style="green" if good else "red"))
            groups.add_row(name, mode, *cells)
        lines.append(groups)
    else:
        lines.append(Text(f"groups in slots: {door.membership}"))
    lines += [Text(f"door: {problem}", style="red") for problem in door.problems]
    return lines


def _keepalived_text(state: str) -> Text:
    return Text(state, style="green" if state in ("MASTER", "BACKUP") else
                "yellow" if state == "unknown" else "red")


def _virtual_ip_lines(vip: VirtualIpReport) -> list[Any]:
    held = (" and ".join(vip.holders) + (" (split brain)" if len(vip.holders) > 1 else "")
            if vip.holders else "no door node")
    lines: list[Any] = [Text.assemble(
        ("virtual IP ", "bold"), f"{vip.address} on {vip.interface}: held by ",
        (held, "green" if len(vip.holders) == 1 else "red"))]
    table = Table(show_edge=False, pad_edge=False)
    for column in ("door node", "door", "keepalived", "state", "holds"):
        table.add_column(column, no_wrap=True)
    for node in vip.nodes:
        holds = (Text("unknown", style="yellow") if node.holds is None
                 else Text("yes" if node.holds else "no"))
        table.add_row(node.address, _container_text(node.door),
                      _container_text(node.keepalived_container),
                      _keepalived_text(node.keepalived), holds)
    lines.append(table)
    lines += [Text(f"{address}: out (nodes[].out), not asked; the other door node carries the "
                   "address alone") for address in vip.nodes_out]
    lines += [Text(f"virtual IP: {problem}", style="red")
              for problem in ([vip.down] if vip.down else []) + vip.problems]
    return lines


def render(report: Report) -> Group:
    title = (f"stack {report.stack}: {report.verdict} "
             f"({report.checked_at.strftime('%Y-%m-%d %H:%M:%S UTC')})")
    if not report.rows:
        return Group(Text(title, style="bold red"), *[Text(note) for note in report.notes])
    lost = [Text(node.line(), style="bold red") for node in report.lost]
    lost += [Text(hung.line(), style="bold red") for hung in report.hung]
    lost += [Text(unit.line(), style="yellow") for unit in report.loading]
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("role", "node", "container", "state", "uptime", "gen", "health", "via",
                   "verdict"):
        table.add_column(column, no_wrap=column != "verdict")
    for row in report.rows:
        table.add_row(
            row.ref.role, row.ref.node, row.ref.name, _state_text(row.docker),
            duration(uptime_seconds(row.docker, report.checked_at)),
            row.docker.generation or "-", _health_text(row.health), row.health.via,
            Text("ok", style="green") if row.ok else Text("; ".join(row.problems), style="red"),
        )
    lines: list[Any] = [*lost, table]
    if report.door is not None:
        lines += _door_lines(report.door)
    if report.rollout is not None:
        rollout = report.rollout
        lines.append(Text.assemble(("rollout ", "bold"), (
            rollout if isinstance(rollout, str) else rollout.describe(),
            "red" if isinstance(rollout, str) else "yellow" if rollout.under_way else "green")))
    if report.virtual_ip is not None:
        lines += _virtual_ip_lines(report.virtual_ip)
    if report.path is not None:
        path = report.path
        outcome = (f"{path.status} in {path.seconds:.3f}s" if path.status is not None
                   and path.seconds is not None else path.summary())
        if path.status not in (None, 200) and path.body:
            outcome += f": {path.body.strip()[:160]}"
        lines.append(Text.assemble(
            ("path ", "bold"), f"POST {path.url} (1 token) via {path.via}: ",
            (outcome, "green" if path.ok else "red")))
    if report.firewall:
        present = sum(state == "present" for state in report.firewall.values())
        lines.append(Text(f"firewall: {present}/{len(report.firewall)} nodes have the table",
                          style="green" if present == len(report.firewall) else "red"))
    healthy = sum(row.ok for row in report.rows)
    lines.append(Text(f"{healthy}/{len(report.rows)} containers ok; exit {report.exit_code}"))
    lines += [Text(note, style="yellow") for note in report.notes]
    return Group(*lines)
