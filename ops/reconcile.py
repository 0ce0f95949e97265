"""`kimipd reconcile`: one pass, or a pass every N seconds (--watch), that heals a stack's dead
groups with the engine: read the stack, probe every container (as `kimipd status`), decide
(`heal_policy`), and when a heal is due and allowed run `refresh` + `up` (`stack_engine`), so the
broken group is replaced whole, gated, re-admitted and smoke-tested like any `up`. Every
decision is a JSON line; the figures go to a Prometheus text file and/or a /metrics endpoint."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import write_to_textfile

from . import status as status_command
from .heal_policy import (
    MESSAGE_PREFIX,
    REFUSED,
    SERVING,
    WAITING,
    Decision,
    Limits,
    Memory,
    assess,
    breakages,
    engine_checks,
    finish_heal,
    forget_heal,
    locked,
    missing_from_slots,
    note_lost_nodes,
    start_heal,
    unreachable_nodes,
)
from .probe import Prober
from .remote import RemoteError, Transport
from .stack import Access, Stack, StackError
from .stack_engine import HealFailed, StackEngine, StackLocked
from .reconcile_metrics import MetricsEndpoint, ReconcileMetrics
from . import rollout
from .rollout import Rollout
from .verdict import Report
from .virtual_ip import VirtualIpReport

# A slot's restore on router.node: the router answers at once, registering takes a request per
# missing group.
RESTORE_TIMEOUT_SECONDS = 60.0
# The rollout's record read again, when the pass's probe (a few seconds) could not: a loaded
# router.node can take longer to answer over SSH, and a slot's missing group waits on it.
RECORD_READ_SECONDS = 30.0


@dataclass(frozen=True)
class Settings:
    stack: str
    project_dir: Path
    limits: Limits
    dry_run: bool
    state_file: Path
    log: TextIO
    metrics_file: Path | None = None
    probe_timeout: float = 5.0
    # One readable line per decision (the journal, with --log FILE); None: the JSON lines only.
    echo: TextIO | None = None
    # How long a healed unit may take to show serving in a fresh status after the update (a
    # docker engine that just replaced containers once answered one of them absent), asked
    # every SETTLE_INTERVAL_SECONDS.
    settle_seconds: float = 30.0


def default_state_file(stack: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "kimipd" / f"reconcile-{stack}.json"


def load_memory(path: Path) -> Memory:
    try:
        return Memory.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return Memory()
    except (OSError, ValueError, TypeError) as error:
        raise StackError(f"{path}: the reconcile state cannot be read ({error}); move it "
                         "away to start afresh (the heal counts restart at 0)") from None


def save_memory(path: Path, memory: Memory) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(memory.as_json(), indent=1) + "\n")
    partial.replace(path)


class Reconciler:
    def __init__(self, settings: Settings, load: Callable[[], Stack],
                 transport_factory: Callable[[Access], Transport],
                 engine_factory: Callable[[], StackEngine] | None = None,
                 clock: Callable[[], float] = time.time,
                 status: Callable[[Stack, Transport, Prober], Report]
                 | None = None) -> None:
        self.settings = settings
        self.load = load
        self.transport_factory = transport_factory
        self.engine_factory = engine_factory or (
            lambda: StackEngine(settings.stack, settings.project_dir))
        self.clock = clock
        self.status = status or self._status
        self.memory = load_memory(settings.state_file)
        self.metrics = ReconcileMetrics()
        self.endpoint: MetricsEndpoint | None = None
        self.last: Decision | None = None
        # What this pass's status saw of the virtual IP (None: no door on two nodes, or the
        # pass did not get that far): its metrics vanish rather than repeat an old answer.
        self.virtual_ip: VirtualIpReport | None = None
        # The units this pass's status found hung: exported with the pass's decision.
        self.hung: tuple[str, ...] = ()
        # With client keys: each door node's requests per client, as this pass's status read.
        self.client_requests: dict[str, dict[str, int]] = {}

    def run_pass(self) -> Decision:
        started = self.clock()
        record: dict[str, Any] = {}
        self.virtual_ip = None
        self.hung = ()
        self.client_requests = {}
        try:
            decision = self._decide(started, record)
        except StackError as error:
            decision = Decision("unreadable", (), f"the stack cannot be read: {error}", REFUSED)
        except Exception as error:  # noqa: BLE001 - a pass that breaks must not end --watch
            text = str(error).strip()
            record["error"] = text[-2000:]
            decision = Decision("error", (), f"the pass failed: {type(error).__name__}: "
                                f"{text.splitlines()[-1][:300] if text else ''}", REFUSED)
        self.memory.last_pass = self.clock()
        if not self.settings.dry_run:
            save_memory(self.settings.state_file, self.memory)
        self._report(decision, started, record)
        return decision

    @contextmanager
    def _probes(self, stack: Stack) -> Iterator[tuple[Transport, Prober]]:
        """One SSH transport and one HTTP client for a pass's probes, closed after them."""
        transport = self.transport_factory(stack.access)
        prober = Prober(transport, self.settings.probe_timeout,
                        tls=status_command.door_tls(stack))
        try:
            yield transport, prober
        finally:
            prober.close()
            transport.close()

    def _decide(self, now: float, record: dict[str, Any]) -> Decision:
        stack = self.load()
        with self._probes(stack) as (transport, prober):
            report = self.status(stack, transport, prober)
            self.virtual_ip = report.virtual_ip
            self.client_requests = report.door.clients if report.door is not None else {}
            seen, slot = self._router_sees(stack, prober)
        if seen is not None:
            record["routerSees"] = seen
        if slot is not None:
            record["routerSeesSlot"] = slot
        broken = breakages(report)
        self.hung = tuple(sorted(unit for unit, breakage in broken.items() if breakage.hung))
        note_lost_nodes(self.memory, unreachable_nodes(report), now)
        decision = assess(broken, self.memory, self.settings.limits, now,
                          serving=stack.topology.serving and stack.serving_config,
                          loading=report.loading)
        if decision.kind == "healthy" and (missing := missing_from_slots(report)):
            return self._register_again(stack, missing, report.rollout)
        if decision.kind != "heal":
            return decision
        engine = self.engine_factory()
        fingerprint = engine.config_fingerprint()
        decision = engine_checks(decision, engine.locks(), engine.history(),
                                 engine.pending_steps, fingerprint, self.memory,
                                 self.settings.limits, self.clock())
        if decision.kind != "heal":
            return decision
        if self.settings.dry_run:
            return dataclasses.replace(
                decision, kind="would-heal", exit_code=WAITING,
                message=f"dry run: would heal {', '.join(decision.units)} (refresh and up); "
                        "nothing changed")
        # A hung unit's containers run, so refresh sees no drift and up would change nothing:
        # they are replaced by name (`up --replace`, in the stack's history), drained, gated
        # and admitted as any replacement.
        hung = [container for unit in decision.units for container in broken[unit].hung]
        # A heal takes a group's load (minutes on the real cluster): the metrics say it is under
        # way meanwhile, so that a hung unit being healed is not alerted as one left alone.
        self.metrics.update(self.settings.stack, self.memory, decision, self.clock(),
                            self.virtual_ip, self.hung, self.client_requests)
        self._write_metrics_file()
        return self._heal(engine, decision, fingerprint, record, hung)

    def _register_again(self, stack: Stack, missing: dict[str, list[str]],
                        record: Rollout | str | None) -> Decision:
        """Every container serves and a slot lacks a group: that slot's restore on router.node
        (what a new slot runs first; it skips a group out for its replacement, and a group of
        another contract than the slot's), outside anyone's update. No refresh, no up: nothing
        drifted. Not while a change of contract is under way (the rollout's record): a slot
        then lacks the other contract's groups on purpose, and the rollout's steps (or the next
        `kimipd up`, forward or back) move them; nor when the record cannot be read."""
        door = stack.topology.door
        assert door is not None  # missing_from_slots found slots
        units = tuple(sorted(missing))
        details = {"problems": {role: [f"{group} not registered in {role}" for group in groups]
                                for role, groups in missing.items()}}
        lacking = "; ".join(f"{role} lacks {', '.join(groups)}"
                            for role, groups in sorted(missing.items()))
        if isinstance(record, str):
            transport = self.transport_factory(stack.access)
            try:
                record = rollout.read(transport, door, RECORD_READ_SECONDS)
            finally:
                transport.close()
        if isinstance(record, str):
            return Decision("rollout-unknown", units, f"{lacking}; not registered again: "
                            f"{record}", WAITING, details)
        if record is not None and record.under_way:
            return Decision("rollout-under-way", units,
                            f"{lacking}: a change of contract is under way ({record.describe()});"
                            " reconcile registers nothing meanwhile: `scripts/kimipd up` takes "
                            "it forward (or back, with the old config)", WAITING,
                            {**details, "rollout": record.as_json()})
        restores = {slot.role: slot.restore for slot in door.slots}
        if not all(restores.get(role) for role in units):
            return Decision("unregistered", units,
                            f"{lacking}, and the stack's outputs name no restore for it: run "
                            "`scripts/kimipd up` once with this version", REFUSED, details)
        if self.settings.dry_run:
            return Decision("would-register", units, f"dry run: {lacking}; would run its "
                            "restore on router.node; nothing changed", WAITING, details)
        locks = self.engine_factory().locks()
        if locks:
            return locked(Decision("re-register", units, lacking, WAITING, details), locks)
        transport = self.transport_factory(stack.access)
        failed = []
        try:
            for role in units:
                try:
                    result = transport.run(door.node, str(restores[role]),
                                           RESTORE_TIMEOUT_SECONDS)
                    if result.status != 0:
                        failed.append(f"{role}: {result.failure}")
                except RemoteError as error:
                    failed.append(f"{role}: {error}")
        finally:
            transport.close()
        if failed:
            return Decision("register-failed", units, f"{lacking}; its restore on "
                            f"{door.node} failed: {'; '.join(failed)}", REFUSED, details)
        return Decision("re-registered", units, f"{lacking}: registered again by its restore "
                        f"on {door.node} (no container changed)", SERVING, details)

    def _status(self, stack: Stack, transport: Transport,
                prober: Prober) -> Report:
        # The whole-path probe is left out: alone it heals nothing (see breakages).
        topology = dataclasses.replace(stack.topology, generate_url=None)
        # The key: each slot's GET /workers, so a slot that lacks a group is seen.
        return status_command.collect(topology, transport, prober,
                                      self.settings.probe_timeout, 0,
                                      api_key=stack.router_api_key,
                                      router_kind=stack.router_kind)

    def _router_sees(self, stack: Stack,
                     prober: Prober) -> tuple[dict[str, Any] | None, str | None]:
        """The rust router's own view (GET /workers with its key): logged beside the decision;
        a heal is decided on the containers, which the router's health checks lag. With the
        door, the first slot that answers (and its name)."""
        topology = stack.topology
        if not stack.router_api_key or not topology.router_url or topology.router is None:
            return None, None
        door = topology.door
        if door is None:
            return self._workers(prober, topology.router_url, topology.router.node,
                                 stack.router_api_key), None
        errors = {}
        for slot in door.slots:
            seen = self._workers(prober, slot.url, door.node, stack.router_api_key, door.port)
            if "error" not in seen:
                return seen, slot.name
            errors[slot.name] = seen["error"]
        return {"error": "; ".join(f"slot {name}: {error}" for name, error in errors.items())
                or "the door lists no slot"}, None

    @staticmethod
    def _workers(prober: Prober, url: str, node: str, api_key: str,
                 router_port: int | None = None) -> dict[str, Any]:
        answer = prober.request("GET", url.rstrip("/") + "/workers", node, api_key=api_key,
                                router_port=router_port)
        try:
            workers = json.loads(answer.body or "")["workers"]
        except (ValueError, KeyError, TypeError):
            return {"error": answer.summary()}
        return {worker["url"]: "healthy" if worker.get("is_healthy") else "unhealthy"
                for worker in workers}

    def _heal(self, engine: StackEngine, decision: Decision, fingerprint: str,
              record: dict[str, Any], hung: list[tuple[str, str]]) -> Decision:
        units = decision.units
        replace = engine.container_urns(hung) if hung else []
        if hung:
            record["replace"] = [urn.rsplit("::", 1)[-1] for urn in replace]
        started = self.clock()
        start_heal(self.memory, units, started)
        save_memory(self.settings.state_file, self.memory)
        summary = "; ".join(p for name in units for p in decision.details["problems"][name])
        message = f"{MESSAGE_PREFIX} heal {', '.join(units)} ({summary})"[:1000]
        self._write({"time": _iso(started), "stack": self.settings.stack, "event": "heal-start",
                     "units": list(units), "message": message})
        try:
            steps = engine.heal(message, replace=replace)
        except StackLocked as locked:
            forget_heal(self.memory, units, started)
            return Decision("locked", units, f"another update holds the stack ({locked}): "
                            "waiting for it to end, never cancelling it", WAITING)
        except Exception as error:  # noqa: BLE001 - any engine failure is a failed heal
            finish_heal(self.memory, units, started, False, self.settings.limits, fingerprint)
            record["seconds"] = round(self.clock() - started, 1)
            failures = error.failures if isinstance(error, HealFailed) else []
            # What says why: the failing resources' own error lines; the engine's output (its
            # tail is the outputs and the summary) only when no resource named one.
            if failures:
                record["failures"] = failures
            else:
                record["error"] = str(error).strip()[-2000:]
            self.memory.last_failure = failure_summary(failures, str(error))
            self.memory.last_failure_resources = [f["resource"] for f in failures]
            retry_at = max(self.memory.unit(n).retry_at or 0 for n in units)
            return Decision("heal-failed", units,
                            f"the heal of {', '.join(units)} failed after "
                            f"{record['seconds']}s ({self.memory.last_failure}); next attempt "
                            f"at {datetime.fromtimestamp(retry_at, timezone.utc):%H:%M:%S} UTC",
                            REFUSED, decision.details)
        record["seconds"] = round(self.clock() - started, 1)
        record["steps"] = steps
        # Judged by its outcome: an update that changed nothing healed nothing, and a unit that
        # still does not serve after it was not healed, whatever the update's exit status.
        unhealed = self._still_broken(units) if _changed(steps) else {
            unit: ["the update replaced nothing (refresh and up: " + _steps(steps) + ")"]
            for unit in units}
        if unhealed:
            finish_heal(self.memory, units, started, False, self.settings.limits, fingerprint)
            reasons = "; ".join(f"{unit}: {', '.join(problems)}"
                                for unit, problems in sorted(unhealed.items()))
            self.memory.last_failure = f"does not serve after the update: {reasons}"[:1000]
            self.memory.last_failure_resources = []
            retry_at = max(self.memory.unit(n).retry_at or 0 for n in units)
            return Decision("heal-failed", units,
                            f"the heal of {', '.join(units)} did not heal: {reasons}; next "
                            f"attempt at {datetime.fromtimestamp(retry_at, timezone.utc):%H:%M:%S}"
                            " UTC", REFUSED, decision.details)
        finish_heal(self.memory, units, started, True, self.settings.limits, fingerprint)
        self.memory.last_healthy = self.clock()
        replaced = f"; replaced {', '.join(record['replace'])}" if record.get("replace") else ""
        return Decision("healed", units, f"healed {', '.join(units)} in {record['seconds']}s "
                        f"(refresh and up: {_steps(steps)}{replaced})", SERVING,
                        decision.details)

    def _still_broken(self, units: tuple[str, ...]) -> dict[str, list[str]]:
        """UNITS that do not serve after the heal's update (the update's gates have admitted
        what it replaced), with their problems: a fresh status, asked again for up to
        settle_seconds while one is broken."""
        stack = self.load()
        deadline = time.monotonic() + self.settings.settle_seconds
        while True:
            with self._probes(stack) as (transport, prober):
                report = self.status(stack, transport, prober)
            broken = breakages(report)
            still = {unit: list(broken[unit].problems) for unit in units if unit in broken}
            if not still or time.monotonic() >= deadline:
                return still
            time.sleep(SETTLE_INTERVAL_SECONDS)

    def _report(self, decision: Decision, started: float, record: dict[str, Any]) -> None:
        self.last = decision
        line = {"time": _iso(self.clock()), "stack": self.settings.stack,
                "decision": decision.kind, "units": list(decision.units),
                "message": decision.message, "exitCode": decision.exit_code,
                "dryRun": self.settings.dry_run,
                "passSeconds": round(self.clock() - started, 1), **record}
        if decision.details:
            line["details"] = dict(decision.details)
        self._write(line)
        if self.settings.echo is not None:
            units = f" [{', '.join(decision.units)}]" if decision.units else ""
            print(f"{decision.kind}{units}: {decision.message}", file=self.settings.echo,
                  flush=True)
        self.metrics.update(self.settings.stack, self.memory, decision, self.clock(),
                            self.virtual_ip, self.hung, self.client_requests)
        self._write_metrics_file()

    def _write_metrics_file(self) -> None:
        if self.settings.metrics_file is not None:
            self.settings.metrics_file.parent.mkdir(parents=True, exist_ok=True)
            # Written aside and renamed over the file: a textfile collector never reads half.
            write_to_textfile(str(self.settings.metrics_file), self.metrics.registry)

    def _write(self, line: dict[str, Any]) -> None:
        self.settings.log.write(json.dumps(line, default=str) + "\n")
        self.settings.log.flush()

    def watch(self, interval: float, stop: threading.Event) -> Decision | None:
        """Passes until STOP is set; a pass under way (a heal's `up`) is finished first."""
        while not stop.is_set():
            self.run_pass()
            stop.wait(interval)
        return self.last


def failure_summary(failures: list[dict[str, str]], output: str) -> str:
    """One line for the log's message, status and the metrics: each failing resource and the
    last line of its error."""
    if not failures:
        lines = [line.strip() for line in output.splitlines() if "error" in line.lower()]
        return (lines[-1] if lines else "no resource named an error")[:300]
    return "; ".join(f"{f['resource']}: {f['error'].splitlines()[-1]}" for f in failures)[:600]


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


SETTLE_INTERVAL_SECONDS = 3.0


def _changed(steps: dict[str, int]) -> bool:
    """Whether an update's step counts changed anything (anything but `same`)."""
    return any(count for op, count in steps.items() if op != "same")


def _steps(steps: dict[str, int]) -> str:
    return ", ".join(f"{op} {count}" for op, count in sorted(steps.items())) or "nothing"
