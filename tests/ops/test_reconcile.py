"""`kimipd reconcile`'s passes (ops/reconcile.py) with the status and the engine replaced by
stand-ins: what each pass logs, remembers and exports; the real engine heals in
tests/integration/test_heal.py."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import threading
import urllib.request
from contextlib import nullcontext
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from components.config import VerificationSpec
from ops.heal_policy import MESSAGE_PREFIX, REFUSED, SERVING, WAITING, Limits
from ops.stack_engine_types import UpdateEntry
from ops.policy_pack import PolicyRun
from ops.reconcile import Reconciler, Settings, load_memory
from ops.reconcile_metrics import MetricsEndpoint, ReconcileMetrics
from ops.stack import Access, Stack, StackError
from ops.topology import Topology
from ops.stack_engine import (HealFailed, StackEngine, StackLocked, config_fingerprint,
                               file_backend_locks)
from tests.ops.loopback import free_port
from tests.outputs import complete_outputs
from tests.unit.test_heal_policy import report, row

OUTPUTS = complete_outputs({
    "serving": True,
    "groups": {"decode-b": {"mode": "decode", "endpoint": "http://10.0.0.1:30000",
                            "nodes": ["10.0.0.1"]}},
    "containers": {"decode-b-r0": {"node": "10.0.0.1", "container": "kimipd-decode-b-r0",
                                   "healthUrl": "http://10.0.0.1:30000/health"}}})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text -> {(name, sorted labels): value}."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


class Engine:
    """What reconcile asks the engine, answered from fields a test sets."""

    def __init__(self) -> None:
        self.locked: list[str] = []
        self.entries: list[UpdateEntry] = []
        self.pending: dict[str, int] = {}
        self.failure: Exception | None = None
        self.heals: list[str] = []
        self.replaced: list[list[str]] = []
        # What a heal's update does to the cluster (the harness's containers), if anything.
        self.fixes = lambda: None
        self.steps = {"replace": 1, "same": 40}

    def config_fingerprint(self) -> str:
        return "config-1"

    def locks(self) -> list[str]:
        return self.locked

    def history(self) -> list[UpdateEntry]:
        return self.entries

    def pending_steps(self) -> dict[str, int]:
        return self.pending

    def container_urns(self, containers) -> list[str]:
        return [f"urn:pulumi:s::kimipd::docker:index/container:Container::{name}@{node}"
                for node, name in containers]

    def heal(self, message: str, replace=()) -> dict[str, int]:
        self.heals.append(message)
        self.replaced.append(list(replace))
        if self.failure:
            raise self.failure
        self.fixes()
        return self.steps


class Unreachable:
    """No node is reached: the status is injected."""

    def close(self) -> None:
        pass


class Harness:
    def __init__(self, tmp_path: Path, dry_run: bool = False, serving: bool = True) -> None:
        self.now = 1_000_000.0
        self.dead = False
        # The unit's container runs but does not answer (a hung group), instead of exiting.
        self.hung = False
        self.engine = Engine()
        self.engine.fixes = self.fixed
        self.log = io.StringIO()
        self.settings = Settings(stack="s", project_dir=tmp_path, limits=Limits(
            grace_seconds=10, max_heals_per_hour=2, backoff_seconds=60), dry_run=dry_run,
            state_file=tmp_path / "state.json", log=self.log,
            metrics_file=tmp_path / "metrics" / "reconcile.prom", settle_seconds=0)
        stack = Stack(Topology.from_outputs("s", OUTPUTS), Access(None, {}), VerificationSpec(),
                      serving_config=serving)
        self.reconciler = self.build(stack)

    def build(self, stack: Stack) -> Reconciler:
        return Reconciler(self.settings, lambda: stack, lambda access: Unreachable(),
                          engine_factory=lambda: self.engine, clock=lambda: self.now,
                          status=lambda stack, transport, prober: report(row(
                              "decode-b-r0", "exited" if self.dead and not self.hung
                              else "running", ok=not self.dead, group="decode-b")))

    def fixed(self) -> None:
        self.dead = False

    def run(self, advance: float = 0.0):
        self.now += advance
        return self.reconciler.run_pass()

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log.getvalue().splitlines()]


def test_a_dead_group_is_healed_after_the_grace_and_every_step_is_logged(tmp_path) -> None:
    h = Harness(tmp_path)
    assert h.run().kind == "healthy"
    h.dead = True
    grace = h.run(5)
    assert (grace.kind, grace.exit_code) == ("grace", WAITING)
    healed = h.run(10)
    assert (healed.kind, healed.exit_code, healed.units) == ("healed", SERVING, ("decode-b",))
    assert len(h.engine.heals) == 1
    assert h.engine.heals[0].startswith(MESSAGE_PREFIX + " heal decode-b (kimipd-decode-b-r0")
    lines = h.lines()
    assert [line.get("decision") or line.get("event") for line in lines] == [
        "healthy", "grace", "heal-start", "healed"]
    assert all(line["stack"] == "s" and line["time"].endswith("+00:00") for line in lines)
    assert lines[-1]["steps"] == {"replace": 1, "same": 40}
    state = load_memory(h.settings.state_file)
    assert state.unit("decode-b").healed_total == 1 and len(state.unit("decode-b").heals) == 1
    metrics = samples(h.settings.metrics_file.read_text())
    assert metrics["kimipd_reconcile_heals_total", (("stack", "s"), ("unit", "decode-b"))] == 1
    assert metrics["kimipd_reconcile_last_decision",
                   (("decision", "healed"), ("stack", "s"))] == 1


def test_the_limits_survive_a_restart_of_the_service(tmp_path) -> None:
    h = Harness(tmp_path)
    # A healed unit that dies again gets its grace again.
    kinds = []
    for n in range(4):
        h.dead = True
        kinds.append(h.run(11 if n else 0).kind)
    assert kinds == ["grace", "healed", "grace", "healed"]
    again = Harness(tmp_path)  # a new process reading the same state file
    again.now, again.dead = h.now, True
    assert again.run(11).kind == "grace"
    limited = again.run(11)
    assert (limited.kind, limited.exit_code) == ("limited", REFUSED)
    assert not again.engine.heals


def test_a_failed_heal_backs_off_and_a_lock_costs_no_heal(tmp_path) -> None:
    h = Harness(tmp_path)
    h.dead = True
    h.run()
    h.engine.failure = RuntimeError("gate decode-b: rank 1 exited\nlong engine output")
    failed = h.run(11)
    assert (failed.kind, failed.exit_code) == ("heal-failed", REFUSED)
    assert "rank 1 exited" in h.lines()[-1]["error"]
    assert h.run(30).kind == "backoff"
    h.engine.failure = StackLocked("the stack is currently locked by 1 lock(s)")
    locked = h.run(31)
    assert (locked.kind, locked.exit_code) == ("locked", WAITING)
    assert len(load_memory(h.settings.state_file).unit("decode-b").heals) == 1


def test_a_failed_heal_names_its_failing_resources_in_the_log_and_the_metrics(
        tmp_path) -> None:
    h = Harness(tmp_path)
    h.dead = True
    h.run()
    h.engine.failure = HealFailed("Outputs:\n  routerUrl: x\nResources: 3 unchanged", [{
        "resource": "decode-b-drain", "type": "command:remote:Command",
        "error": "process exited with status 1\nrouter-members: decode-b not drained"}])
    failed = h.run(11)
    line = h.lines()[-1]
    assert failed.kind == "heal-failed" and "error" not in line, line
    assert line["failures"][0]["resource"] == "decode-b-drain"
    assert "decode-b-drain: router-members: decode-b not drained" in line["message"]
    text = h.settings.metrics_file.read_text()
    assert samples(text)[("kimipd_reconcile_heal_failing_resource",
                          (("resource", "decode-b-drain"), ("stack", "s")))] == 1
    assert load_memory(h.settings.state_file).last_failure_resources == ["decode-b-drain"]
    # A heal that converges clears it.
    h.engine.failure = None
    assert h.run(200).kind == "healed"
    assert "kimipd_reconcile_heal_failing_resource{" not in h.settings.metrics_file.read_text()


def test_a_lost_node_is_waited_for_and_its_wait_is_a_metric(tmp_path) -> None:
    h = Harness(tmp_path)
    lost = report(row("decode-b-r0", "unknown", ok=False, group="decode-b"))
    h.reconciler.status = lambda stack, transport, prober: lost
    first = h.run()
    waited = h.run(30)
    assert waited.kind == "unreachable" and "10.0.0.1 since" in waited.message, waited.message
    assert "nodes[].out" in waited.message
    text = h.settings.metrics_file.read_text()
    key = ("kimipd_reconcile_node_unreachable_since_timestamp_seconds",
           (("node", lost.rows[0].ref.node), ("stack", "s")))
    assert samples(text)[key] == 1_000_000.0, first
    h.reconciler.status = lambda stack, transport, prober: report(row(
        "decode-b-r0", "running", ok=True, group="decode-b"))
    assert h.run(30).kind == "healthy"
    assert "node_unreachable_since_timestamp_seconds{" not in h.settings.metrics_file.read_text()


def test_a_dry_run_decides_but_runs_and_writes_nothing(tmp_path) -> None:
    h = Harness(tmp_path, dry_run=True)
    h.dead = True
    h.run()
    would = h.run(11)
    assert (would.kind, would.exit_code) == ("would-heal", WAITING)
    assert "dry run: would heal decode-b" in would.message
    assert not h.engine.heals and not h.settings.state_file.exists()


def test_serving_false_in_the_config_is_never_healed(tmp_path) -> None:
    h = Harness(tmp_path, serving=False)
    h.dead = True
    assert [h.run(20).kind for _ in range(3)] == ["not-serving"] * 3
    assert not h.engine.heals


def test_an_unreadable_stack_is_logged_and_refused(tmp_path) -> None:
    h = Harness(tmp_path)

    def unreadable() -> Stack:
        raise StackError("`pulumi stack output` failed: no stack named 's'")

    h.reconciler.load = unreadable
    decision = h.run()
    assert (decision.kind, decision.exit_code) == ("unreadable", REFUSED)
    assert "no stack named" in h.lines()[-1]["message"]


def test_the_metrics_are_valid_prometheus_text_on_a_file_and_an_endpoint(tmp_path) -> None:
    h = Harness(tmp_path)
    port = free_port()
    h.reconciler.endpoint = MetricsEndpoint("127.0.0.1", port, h.reconciler.metrics.registry)
    try:
        h.dead = True
        h.run()
        h.run(11.125)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            served = answer.read().decode()
    finally:
        h.reconciler.endpoint.close()
    assert served == h.settings.metrics_file.read_text()
    checked = subprocess.run(["promtool", "check", "metrics"], input=served, text=True,
                             capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Seconds since the epoch, to the millisecond (not 1e+06).
    assert samples(served)["kimipd_reconcile_last_pass_timestamp_seconds",
                           (("stack", "s"),)] == 1000011.125


def test_metrics_text_escapes_label_values() -> None:
    memory = load_memory(Path("/nonexistent/state.json"))
    memory.unit('we"ird').healed_total = 1
    metrics = ReconcileMetrics()
    metrics.update("s", memory, None, 0.0)
    text = generate_latest(metrics.registry).decode()
    assert 'unit="we\\"ird"' in text


def test_the_file_backend_lock_is_seen_with_its_holder(tmp_path) -> None:
    locks = tmp_path / ".pulumi" / "locks" / "organization" / "kimipd" / "sim"
    locks.mkdir(parents=True)
    assert file_backend_locks(f"file://{tmp_path}", "kimipd", "sim") == []
    (locks / "a1.json").write_text(json.dumps({"pid": 42, "username": "ops", "hostname": "h",
                                               "timestamp": "2026-12-01T10:00:00Z"}))
    assert file_backend_locks(f"file://{tmp_path}", "kimipd", "sim") == [
        "ops@h pid 42 since 2026-12-01T10:00:00Z"]
    assert file_backend_locks(f"file://{tmp_path}", "kimipd", "other") == []
    assert file_backend_locks("https://api.pulumi.com", "kimipd", "sim") == []


def test_the_config_fingerprint_leaves_secrets_out() -> None:
    base = {"kimipd:serving": {"value": "true", "secret": False},
            "kimipd:routerApiKey": {"value": "k1", "secret": True}}
    rotated = base | {"kimipd:routerApiKey": {"value": "k2", "secret": True}}
    changed = base | {"kimipd:serving": {"value": "false", "secret": False}}
    assert config_fingerprint(base) == config_fingerprint(rotated)
    assert config_fingerprint(base) != config_fingerprint(changed)


@pytest.mark.timeout(30)
def test_watch_finishes_its_pass_and_stops(tmp_path) -> None:
    h = Harness(tmp_path)
    stop = threading.Event()
    runs = []
    original = h.reconciler.run_pass

    def counted():
        runs.append(1)
        if len(runs) == 3:
            stop.set()
        return original()

    h.reconciler.run_pass = counted
    h.reconciler.watch(0.01, stop)
    assert len(runs) == 3 and h.reconciler.last.kind == "healthy"


def test_a_pass_that_breaks_is_logged_and_the_next_one_runs(tmp_path) -> None:
    h = Harness(tmp_path)
    h.dead = True
    h.run()

    def broken_preview() -> dict[str, int]:
        raise RuntimeError("preview failed\nerror: program exited with code 1")

    h.engine.pending_steps = broken_preview
    decision = h.run(11)
    assert (decision.kind, decision.exit_code) == ("error", REFUSED)
    assert "RuntimeError: error: program exited with code 1" in decision.message
    assert "preview failed" in h.lines()[-1]["error"]
    h.engine.pending_steps = lambda: {}
    assert h.run(1).kind == "healed"


def test_a_heals_refresh_and_up_events_also_reach_its_observer() -> None:
    class Stack:
        def refresh(self, on_event, **_):
            on_event("refresh event")

        def up(self, on_event, **_):
            on_event("up event")

            class Summary:
                resource_changes = {"replace": 1, "same": 9}

            class Result:
                summary = Summary()
            return Result()

    seen: list[str] = []
    # Without its constructor: no CLI, no workspace; the stack is the stand-in above.
    engine = StackEngine.__new__(StackEngine)
    engine.stack, engine.on_event = Stack(), seen.append
    engine.policy = lambda: nullcontext(PolicyRun(packs=[], configs=[]))  # type: ignore[method-assign]
    assert engine.heal("kimipd reconcile: heal router-a") == {"replace": 1, "same": 9}
    assert seen == ["refresh event", "up event"]


def test_a_hung_unit_is_replaced_by_name_and_the_line_says_what(tmp_path) -> None:
    """Its container runs and does not answer: refresh sees no drift, so the heal's update
    replaces exactly its containers (`up --replace`)."""
    h = Harness(tmp_path)
    h.dead = h.hung = True
    assert h.run().kind == "grace"
    healed = h.run(11)
    assert healed.kind == "healed", healed
    assert h.engine.replaced == [
        ["urn:pulumi:s::kimipd::docker:index/container:Container::kimipd-decode-b-r0@10.0.0.1"]]
    assert "replaced kimipd-decode-b-r0@10.0.0.1" in healed.message
    assert h.lines()[-1]["replace"] == ["kimipd-decode-b-r0@10.0.0.1"]


def test_a_hung_unit_is_a_metric_with_the_decision_that_keeps_it_until_it_is_healed(
        tmp_path) -> None:
    """Each pass exports every hung unit with its decision and since when (what
    KimipdUnitHungNotHealed reads): grace, then `heal` while the heal's update runs (written
    before it, so a group loading for minutes is not alerted as left alone), then nothing once
    healed. An exited unit is not hung."""
    h = Harness(tmp_path)
    h.dead = h.hung = True
    name = "kimipd_reconcile_hung_since_timestamp_seconds"
    assert h.run().kind == "grace"
    broken_at = h.now
    key = (name, (("decision", "grace"), ("stack", "s"), ("unit", "decode-b")))
    assert samples(h.settings.metrics_file.read_text())[key] == broken_at
    during = []
    h.engine.fixes = lambda: (during.append(h.settings.metrics_file.read_text()),
                              h.fixed())
    assert h.run(11).kind == "healed"
    assert samples(during[0])[
        (name, (("decision", "heal"), ("stack", "s"), ("unit", "decode-b")))] == broken_at
    assert f"{name}{{" not in h.settings.metrics_file.read_text()
    h.dead, h.hung = True, False
    h.run(100)
    assert f"{name}{{" not in h.settings.metrics_file.read_text()


def test_an_exited_unit_is_healed_by_refresh_and_up_alone(tmp_path) -> None:
    h = Harness(tmp_path)
    h.dead = True
    h.run()
    assert h.run(11).kind == "healed"
    assert h.engine.replaced == [[]]
    assert "replace" not in h.lines()[-1]


def test_an_update_that_replaced_nothing_is_no_heal_and_counts_as_an_attempt(tmp_path) -> None:
    h = Harness(tmp_path)
    h.dead = h.hung = True
    h.engine.steps = {"same": 302}
    h.engine.fixes = lambda: None  # the update changed nothing, so nothing serves again
    h.run()
    failed = h.run(11)
    assert (failed.kind, failed.exit_code) == ("heal-failed", REFUSED)
    assert "the update replaced nothing (refresh and up: same 302)" in failed.message
    state = load_memory(h.settings.state_file)
    assert state.unit("decode-b").failures == 1 and len(state.unit("decode-b").heals) == 1
    assert h.run(11).kind == "backoff"  # the back-off counts the real attempt


def test_a_unit_that_still_does_not_serve_after_the_update_is_heal_failed(tmp_path) -> None:
    h = Harness(tmp_path)
    h.dead = True
    h.engine.fixes = lambda: None  # replaced, and the new container fails as well
    h.run()
    failed = h.run(11)
    assert failed.kind == "heal-failed", failed
    assert "did not heal: decode-b: kimipd-decode-b-r0 on 10.0.0.1: exited" in failed.message
    assert load_memory(h.settings.state_file).last_failure.startswith(
        "does not serve after the update: decode-b")


def test_a_unit_that_serves_once_the_engine_settles_is_healed(tmp_path, monkeypatch) -> None:
    """Right after an update a docker engine once answered a replaced container absent: the
    outcome is asked again within settle_seconds before it is called a failed heal."""
    monkeypatch.setattr("ops.reconcile.SETTLE_INTERVAL_SECONDS", 0.01)
    h = Harness(tmp_path)
    h.reconciler.settings = dataclasses.replace(h.settings, settle_seconds=5)
    h.dead = True
    h.engine.fixes = lambda: None  # broken right after the update ...
    checks = []

    def status(stack, transport, prober):
        if h.engine.heals and len(checks) > 3:
            h.dead = False  # ... serving at a later look
        checks.append(h.dead)
        return report(row("decode-b-r0", "exited" if h.dead else "running", ok=not h.dead,
                          group="decode-b"))

    h.reconciler.status = status
    h.run()
    assert h.run(11).kind == "healed"
    assert checks.count(True) >= 3 and checks[-1] is False

