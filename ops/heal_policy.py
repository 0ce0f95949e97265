"""What `kimipd reconcile` decides, as pure functions of what it saw and what it remembers.

A *unit* is what a heal restarts whole: an SGLang group (every rank), the Mooncake master, the
router, or with the door the door itself and each of its slots (`router-a`, `router-b`: one
slot dead while the other serves is its own unit, healed alone); with the door on two nodes,
each node's door and keepalived too (`door-A-B-C-D`, `keepalived`, `keepalived-A-B-C-D`), so a
dead keepalived is put back without touching the door that serves beside it. A heal is one
`refresh` + `up` of the stack; it replaces every unit found broken.
The limits are the ones an operator asks of an automatic restarter: a grace period before the
first heal, at most K heals per unit per hour, exponential back-off after a failed heal, hands
off while a person's update is recent or running, and never over changes no one applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from .stack_engine_types import UpdateEntry
from .verdict import LoadingUnit, Report, hung_units, unit_of

HOUR = 3600.0

# Exit codes of a pass (`kimipd reconcile` without --watch).
SERVING = 0  # every unit healthy, healed in this pass, or the stack is meant to be down
WAITING = 1  # something is broken and left for now: grace period, lock held, recent human update
REFUSED = 2  # the heal failed, or the limits refuse it; a person must look

# The mark of reconcile's own updates in the stack's history (their message starts with it).
MESSAGE_PREFIX = "kimipd reconcile:"


@dataclass(frozen=True)
class Limits:
    grace_seconds: float = 60.0
    max_heals_per_hour: int = 3
    backoff_seconds: float = 60.0  # after the first failed heal; doubled after each further one
    backoff_max_seconds: float = 1800.0
    human_window_seconds: float = 900.0


@dataclass(frozen=True)
class Breakage:
    """Why one unit is broken; `reachable` is False when a node did not answer over SSH.
    `hung` names (node, container) of every container of a unit that runs but does not serve
    (each container there, running or paused, and a health check failing or a container
    paused): refresh sees no drift in it, so a heal must replace those containers."""

    problems: tuple[str, ...]
    reachable: bool = True
    hung: tuple[tuple[str, str], ...] = ()



@dataclass
class UnitMemory:
    broken_since: float | None = None
    heals: list[float] = field(default_factory=list)  # start of each heal in the last hour
    failures: int = 0  # failed heals since the last good one
    retry_at: float | None = None
    healed_total: int = 0
    failed_total: int = 0


@dataclass
class Memory:
    """What survives between passes and restarts of the service (a JSON file per stack)."""

    units: dict[str, UnitMemory] = field(default_factory=dict)
    last_pass: float | None = None
    last_healthy: float | None = None
    # The stack's config fingerprint when a heal failed: retrying that heal may finish the
    # steps it left, but not apply a config someone changed since.
    failed_heal_config: str | None = None
    # The last failed heal's failing resources and their last error line, until a heal
    # converges (the log line has the full error lines; status and the metrics show this).
    last_failure: str | None = None
    last_failure_resources: list[str] = field(default_factory=list)
    # Node -> when a pass first found it not answering over SSH (while it stays so).
    lost_since: dict[str, float] = field(default_factory=dict)

    def unit(self, name: str) -> UnitMemory:
        return self.units.setdefault(name, UnitMemory())

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Memory:
        units = {name: UnitMemory(**value) for name, value in (data.get("units") or {}).items()}
        return cls(units=units, last_pass=data.get("last_pass"),
                   last_healthy=data.get("last_healthy"),
                   failed_heal_config=data.get("failed_heal_config"),
                   last_failure=data.get("last_failure"),
                   last_failure_resources=list(data.get("last_failure_resources") or []),
                   lost_since=dict(data.get("lost_since") or {}))


@dataclass(frozen=True)
class Decision:
    """One pass's verdict: `kind` is the JSON log's `decision` field."""

    kind: str  # healthy | loading | not-serving | grace | limited | backoff | unreachable | heal |
    #            locked | human-window | pending-changes; a slot without a group:
    #            re-registered | would-register | register-failed | unregistered |
    #            rollout-under-way | rollout-unknown (ops/rollout.py)
    units: tuple[str, ...]
    message: str
    exit_code: int
    details: Mapping[str, Any] = field(default_factory=dict)


def breakages(report: Report) -> dict[str, Breakage]:
    """Broken units and why. A stale restart-generation label is a pending `up`, not a failure,
    and the whole-path probe alone heals nothing (no container drifted), so neither counts."""
    found: dict[str, list[str]] = {}
    unreachable: set[str] = set()
    # A group loading within its bound is not broken: its grace starts once the bound is past.
    loading = {unit.unit for unit in report.loading}
    for row in report.rows:
        if unit_of(row) in loading:
            continue
        docker = row.docker
        problems = []
        if docker.state == "unknown":
            problems.append(f"{row.ref.node}: {docker.error or 'docker state unknown'}")
            unreachable.add(unit_of(row))
        elif docker.state == "absent":
            problems.append(f"{row.ref.name} on {row.ref.node}: container absent")
        elif docker.state == "paused":
            problems.append(f"{row.ref.name} on {row.ref.node}: paused (running, not "
                            "answering)")
        elif docker.state != "running":
            problems.append(f"{row.ref.name} on {row.ref.node}: {docker.state} "
                            f"(exit {docker.exit_code})")
        elif not row.health.ok:
            problems.append(f"{row.ref.name} on {row.ref.node}: health {row.health.summary()} "
                            "(running, not answering)")
        if problems:
            found.setdefault(unit_of(row), []).extend(problems)
    hung = hung_units(report.rows, loading)
    return {unit: Breakage(tuple(problems), unit not in unreachable, hung.get(unit, ()))
            for unit, problems in found.items()}


def missing_from_slots(report: Report) -> dict[str, list[str]]:
    """Slot role -> the groups that slot's router does not list, for each slot that runs and
    answered GET /workers. Every container serving and a group still missing from one slot
    (its admission gave up on a slot that was being replaced) is no container's drift, so
    `refresh` and `up` would not see it: the slot's restore puts it back."""
    if report.door is None:
        return {}
    missing = {}
    for slot in report.door.slots:
        if slot.container != "running" or slot.members is None:
            continue
        groups = [member.group for member in slot.members if not member.registered]
        if groups:
            missing[slot.role] = groups
    return missing


def unreachable_nodes(report: Report) -> set[str]:
    """Nodes whose docker state could not be read over SSH in this pass."""
    return {row.ref.node for row in report.rows if row.docker.state == "unknown"}


def note_lost_nodes(memory: Memory, lost: Iterable[str], now: float) -> dict[str, float]:
    """Keeps when each node was first found lost, forgets the ones that answer again."""
    lost = set(lost)
    memory.lost_since = {node: memory.lost_since.get(node, now) for node in sorted(lost)}
    return dict(memory.lost_since)


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%H:%M:%S UTC")


def _recent(heals: Iterable[float], now: float) -> list[float]:
    return [started for started in heals if now - started < HOUR]


def assess(broken: Mapping[str, Breakage], memory: Memory, limits: Limits, now: float,
           serving: bool, loading: Iterable[LoadingUnit] = ()) -> Decision:
    """The verdict before the engine is asked anything; `heal` means: go on to the stack checks
    (`engine_checks`). LOADING: the groups loading within their bound (status's judgement),
    waited for when nothing else is broken. Updates MEMORY's broken-since times."""
    for name, unit in memory.units.items():
        unit.heals = _recent(unit.heals, now)
        if name not in broken:
            unit.broken_since = None
    if not serving:
        return Decision("not-serving", (), "serving is false: no container is meant to run, "
                        "nothing to heal", SERVING)
    loading = sorted(loading, key=lambda unit: unit.unit)
    if not broken and loading:
        # Not healthy (it serves nothing yet) and not broken: a replacement loads it again.
        return Decision(
            "loading", tuple(unit.unit for unit in loading),
            "; ".join(f"{unit.unit} loading: up {unit.seconds:.0f}s of its "
                      f"{unit.bound:.0f}s load bound ({unit.evidence})" for unit in loading)
            + "; hung once past it", WAITING,
            {"loading": [unit.as_json() for unit in loading]})
    if not broken:
        memory.last_healthy = now
        return Decision("healthy", (), "every unit serves", SERVING)
    broken_since: dict[str, float] = {}
    for name in broken:
        unit = memory.unit(name)
        if unit.broken_since is None:
            unit.broken_since = now
        broken_since[name] = unit.broken_since
    units = tuple(sorted(broken))
    problems = {name: list(broken[name].problems) for name in units}
    oldest = min(broken_since.values())
    if now - oldest < limits.grace_seconds:
        return Decision("grace", units, f"{', '.join(units)} broken for {now - oldest:.0f}s; "
                        f"healing after {limits.grace_seconds:.0f}s if it stays broken",
                        WAITING, {"problems": problems})
    limited = [name for name in units
               if len(memory.unit(name).heals) >= limits.max_heals_per_hour]
    if limited:
        name = limited[0]
        again = _clock(min(memory.unit(name).heals) + HOUR)
        return Decision(
            "limited", units,
            f"{name} was healed {len(memory.unit(name).heals)} times in the last hour (limit "
            f"{limits.max_heals_per_hour}, --max-heals-per-hour): not healing again before "
            f"{again}. Look at why it keeps dying (`scripts/kimipd logs --role {name}`), then "
            "`pulumi refresh` and `pulumi up` by hand", REFUSED, {"problems": problems})
    waiting = [(at, name) for name in units
               if (at := memory.unit(name).retry_at) is not None and at > now]
    if waiting:
        retry_at, name = max(waiting)
        return Decision(
            "backoff", units,
            f"the last heal of {name} failed ({memory.unit(name).failures} in a row): next "
            f"attempt at {_clock(retry_at)} (back-off)", REFUSED,
            {"problems": problems, "retryAt": retry_at})
    cut_off = [name for name in units if not broken[name].reachable]
    if cut_off:
        lost = {node: _clock(since) for node, since in sorted(memory.lost_since.items())}
        nodes = (" (" + ", ".join(f"{node} since {since}" for node, since in lost.items()) + ")"
                 if lost else "")
        return Decision(
            "unreachable", units,
            f"{', '.join(cut_off)}: a node does not answer over SSH{nodes}, so an `up` could "
            "not reach it either; not healing until it answers (a node that will not come "
            "back: set its nodes[].out and run `scripts/kimipd up`)", REFUSED,
            {"problems": problems, "lostNodes": lost})
    return Decision("heal", units, f"healing {', '.join(units)}: refresh and up",
                    SERVING, {"problems": problems})


def by_reconcile(entry: UpdateEntry) -> bool:
    """An update reconcile ran (its message), not a person's."""
    return entry.message.startswith(MESSAGE_PREFIX)


def locked(wanted: Decision, locks: list[str]) -> Decision:
    """WANTED (a heal, a re-registration) waits: someone's update holds the stack's LOCKS."""
    return Decision("locked", wanted.units, "another update holds the stack's lock ("
                    + "; ".join(locks) + "): waiting for it to end, never cancelling it",
                    WAITING, wanted.details)


def engine_checks(heal: Decision, locks: list[str], history: list[UpdateEntry],
                  pending_steps: Callable[[], Mapping[str, int]], config_fingerprint: str,
                  memory: Memory, limits: Limits, now: float) -> Decision:
    """Whether the engine may run the heal now: no one else's update holding the stack, no
    recent update by a person, and no change waiting in the config that no one applied
    (PENDING_STEPS: the preview's step counts other than `same`, before any refresh; asked
    last, a preview runs the program)."""
    if locks:
        return locked(heal, locks)
    by_person = [entry for entry in history if not by_reconcile(entry)]
    if by_person:
        last = max(by_person, key=lambda entry: entry.ended or entry.started)
        since = now - (last.ended or last.started)
        if since < limits.human_window_seconds:
            return Decision(
                "human-window", heal.units,
                f"a person's {last.kind} ended {since / 60:.1f} min ago "
                f"({last.result}{': ' + last.message if last.message else ''}); hands off for "
                f"{limits.human_window_seconds / 60:.0f} min after one (--human-window-minutes)",
                WAITING, heal.details)
    pending = pending_steps()
    if pending:
        our_retry = (memory.failed_heal_config == config_fingerprint and history
                     and by_reconcile(history[0]))
        if not our_retry:
            steps = ", ".join(f"{op} {count}" for op, count in sorted(pending.items()))
            return Decision(
                "pending-changes", heal.units,
                f"the stack's config has changes no one applied (pulumi preview: {steps}); "
                "a heal would apply them too. Run `pulumi preview --diff` and `pulumi up` "
                "yourself", REFUSED, heal.details)
    return heal


def start_heal(memory: Memory, units: Iterable[str], started: float) -> None:
    """Counted when it starts, so a heal cut short (the service killed mid-`up`) still counts
    towards the hourly limit."""
    for name in units:
        memory.unit(name).heals.append(started)


def forget_heal(memory: Memory, units: Iterable[str], started: float) -> None:
    """The engine refused to start it (another update held the lock): it never ran."""
    for name in units:
        heals = memory.unit(name).heals
        if started in heals:
            heals.remove(started)


def finish_heal(memory: Memory, units: Iterable[str], started: float, ok: bool,
                limits: Limits, config_fingerprint: str) -> None:
    for name in units:
        unit = memory.unit(name)
        if ok:
            unit.failures, unit.retry_at, unit.broken_since = 0, None, None
            unit.healed_total += 1
        else:
            unit.failures += 1
            unit.failed_total += 1
            delay = limits.backoff_seconds * 2 ** (unit.failures - 1)
            unit.retry_at = started + min(delay, limits.backoff_max_seconds)
    memory.failed_heal_config = None if ok else config_fingerprint
    if ok:
        memory.last_failure, memory.last_failure_resources = None, []
