"""reconcile's decisions through the real engine, on a small 2P2D stack (nodes 9-12, four groups
of one node behind the rust router and its door: engine.small_2p2d_values), beside the 8-node
modules: a dry run, a person's recent update, `serving: false` in the config and someone else's
lock change nothing, and one pass heals a killed group; `reconcile --watch`, started from the
systemd unit's own ExecStart line and environment file, heals a decode rank killed with SIGKILL
under load and refuses the second heal of the hour (a hang, exported for its alert). What needs
the two-node groups and the door on two nodes (a frozen rank, a whole mode, a lost node) is
test_heal.py's and test_door.py's.
Tests run in file order on one stack."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from ops.heal_policy import REFUSED
from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    AUTHORIZED, SMALL_ROUTER, StreamingLoad, assert_replaced_only, container_ids, env, kimipd,
    new_stack, project, settled_status, small_2p2d_values, small_sim, status_problems)
from tests.integration.healing import (
    PASSPHRASE, command_line, decisions, descendants, heal_under_load, healthy_workers,
    kill_server, reconcile_once, reconcile_service, stop_server, wait_exited)
from tests.integration.sim import SMALL_NODES, SimCluster
from tests.ops.loopback import wait_until

pytestmark = pytest.mark.timeout(1800)

STACK = "heal-decisions"
# The group these tests break: decode-b, on the small node that carries nothing else (decode-a's
# node has the door and both slots too).
GROUP = "decode-b"
NODE = SMALL_NODES[3]
CONTAINER = "kimipd-decode-b-r0"


# decode-b's speed: a request of LONG_TOKENS runs long enough to be open through a drain.
DECODE_B_TOKENS_PER_S = 26
LONG_TOKENS = 50 * DECODE_B_TOKENS_PER_S
# What the stand-in reads in a running rank 0 (sim/standin/README.md): /health answers this late
# while requests run, as a busy SGLang's does.
BUSY_HEALTH_FILE = "/tmp/sglang-standin-busy-health-seconds"


# decode-b's load bound (groups.decode-b.loadBoundSeconds): well past reconcile's grace (4 s)
# and a few passes, short of what a restarted decode-b loads for (LOAD_FILE).
LOAD_BOUND_SECONDS = 40
# What the stand-in reads at a start (sim/standin/README.md): seconds it loads for.
LOAD_FILE = "/tmp/sglang-standin-load-seconds"


def module_values(sim: SimCluster) -> dict:
    values = small_2p2d_values(sim)
    values["groups"][GROUP]["env"] = {
        "SGLANG_STANDIN_DECODE_TOKENS_PER_S": str(DECODE_B_TOKENS_PER_S)}
    values["groups"][GROUP]["loadBoundSeconds"] = LOAD_BOUND_SECONDS
    return values


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    stack = new_stack(project, sim, STACK, module_values(sim))
    stack.up()
    yield stack
    # decode-b stays dead past its limit: the destroy takes a stack with a dead group down too.
    stack.destroy()


@pytest.fixture(scope="module")
def url(stack: auto.Stack) -> str:
    """decode-b's rank 0, as the router lists it."""
    return stack.outputs()["groups"].value[GROUP]["endpoint"]


def running_requests(url: str) -> int:
    request = urllib.request.Request(url + "/get_load", headers=AUTHORIZED)
    with urllib.request.urlopen(request, timeout=5) as answer:
        return sum(entry["num_reqs"] for entry in json.load(answer))


def timed_health(url: str) -> tuple[int, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url + "/health", timeout=60) as answer:
            return answer.status, time.monotonic() - started
    except urllib.error.HTTPError as failure:
        return failure.code, time.monotonic() - started


def test_a_busy_group_rolled_by_a_planned_change_finishes_its_open_requests(
        stack: auto.Stack, project: Project, sim: SimCluster, url: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """decode-b busy, as SGLang is under long prefills: its rank 0's /health answers 200, 12 s
    late, while requests run on it. A planned change of decode-b (restartGeneration) under long
    streams drains it: the drain judges its health as SGLang does (the group's bound, 21 s), so it
    waits for the open requests and none is cut. A 5 s probe took it for hung and gave them up
    15 s into the drain, cutting them."""
    before = container_ids(sim)
    busy: list[tuple[int, float]] = []
    with StreamingLoad(rate=1.0, url=SMALL_ROUTER, tokens=LONG_TOKENS) as load:
        wait_until(lambda: running_requests(url) >= 1, 30, f"a long request running on {GROUP}")
        made = sim.docker(NODE, "exec", CONTAINER, "sh", "-c", f"echo 12 > {BUSY_HEALTH_FILE}")
        assert made.returncode == 0, made.stderr
        probe = threading.Thread(target=lambda: busy.append(timed_health(url)), daemon=True)
        probe.start()
        open_then = running_requests(url)
        groups = module_values(sim)["groups"]
        groups[GROUP]["restartGeneration"] = 1
        project.update_stack(STACK, {"groups": groups})
        started = time.monotonic()
        stack.up()
        took = time.monotonic() - started
        probe.join(60)
        time.sleep(2)
    failed = load.failed()
    what = (f"{GROUP} busy (/health {busy}) restarted in {took:.0f}s with {open_then} "
            "request(s) open on it")
    with capsys.disabled():  # the run's log keeps the figures (docs/healing.md)
        print("\n" + load.summary(what))
    assert busy and busy[0][0] == 200 and busy[0][1] >= 12, f"{GROUP} was not busy: {busy}"
    assert not failed, [answer.outcome for answer in failed]
    assert_replaced_only(before, container_ids(sim), f"kimipd-{GROUP}-")


def current_groups(project: Project) -> dict:
    values = yaml.safe_load((project.directory / f"Pulumi.{STACK}.yaml").read_text())["config"]
    return values["kimipd:groups"]


def test_a_failing_canary_stops_the_rollout_and_the_rest_keep_serving(
        stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    """Both decode groups changed, each replacement dying while it loads: the first one
    replaced (the canary) fails its gate, the rollout stops there holding the mode's lease, and
    the other keeps running and serving, untouched; the config fixed, the next `up` replaces the
    canary again and rolls the rest. (On this small 2P2D stack: the rollout's steps are the
    8-node stack's, without its time.)"""
    decode = {name: endpoint for name, endpoint in
              ((name, group["endpoint"]) for name, group in stack.outputs()["groups"].value.items()
               if group["mode"] == "decode")}
    fixed = current_groups(project)
    groups = copy.deepcopy(fixed)
    for name in decode:
        groups[name]["env"] = groups[name].get("env", {}) | {
            "SGLANG_STANDIN_EXIT_WHILE_LOADING": "0"}  # one node: its rank 0
    project.update_stack(STACK, {"groups": groups})
    before = container_ids(sim)
    with pytest.raises(auto.CommandError) as failure:
        stack.up()
    message = str(failure.value)
    after = container_ids(sim)
    replaced = [name for name in decode
                if after.get(f"kimipd-{name}-r0") != before[f"kimipd-{name}-r0"]]
    assert len(replaced) == 1, f"the rollout went past its canary: {replaced}"
    canary = replaced[0]
    survivor = next(name for name in decode if name != canary)
    assert f"{survivor} keeps running and serving" in message, message[-3000:]
    assert f"{canary} holds the decode rollout lease" in message, message[-3000:]
    assert after[f"kimipd-{survivor}-r0"] == before[f"kimipd-{survivor}-r0"]
    healthy = healthy_workers(SMALL_ROUTER)
    assert decode[survivor] in healthy and decode[canary] not in healthy, healthy
    body = json.dumps({"text": "still", "sampling_params": {"max_new_tokens": 2}}).encode()
    for _ in range(5):
        request = urllib.request.Request(SMALL_ROUTER + "/generate", data=body, headers={
            "Content-Type": "application/json", **AUTHORIZED})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    # Fixed config: the next `up` replaces the canary again, then rolls the rest.
    project.update_stack(STACK, {"groups": fixed})
    stack.refresh()
    stack.up()
    assert len(healthy_workers(SMALL_ROUTER)) == 4


def test_a_dry_run_and_a_recent_update_change_nothing_then_one_pass_heals(
        stack: auto.Stack, project: Project, sim: SimCluster, url: str, tmp_path: Path) -> None:
    # The operator's selected stack is another one; reconcile names its stack, never selects.
    project.stack("bystander")
    kill_server(sim, NODE, CONTAINER)
    wait_exited(sim, NODE, CONTAINER)
    before, history = container_ids(sim), len(stack.history())

    # The fixture's `up` was a person's: hands off for the window, even past the grace.
    code, line = reconcile_once(project, STACK, tmp_path, "--dry-run", "--grace-seconds", "0")
    assert (code, line["decision"], line["units"]) == (1, "human-window", [GROUP]), line
    code, line = reconcile_once(project, STACK, tmp_path, "--dry-run", "--grace-seconds", "0",
                                "--human-window-minutes", "0")
    assert (code, line["decision"], line["units"]) == (1, "would-heal", [GROUP]), line
    assert "exited" in " ".join(line["details"]["problems"][GROUP])
    assert container_ids(sim) == before, "a dry run changed a container"
    assert len(stack.history()) == history, "a dry run ran an update"
    assert not (tmp_path / "once-state.json").exists(), "a dry run wrote its state"

    # The config says the stack should be down (not applied yet): never healed.
    project.update_stack(STACK, {"serving": False})
    try:
        code, line = reconcile_once(project, STACK, tmp_path, "--grace-seconds", "0",
                                    "--human-window-minutes", "0")
        assert (code, line["decision"]) == (0, "not-serving"), line
        assert len(stack.history()) == history and container_ids(sim) == before
    finally:
        project.update_stack(STACK, {"serving": True})

    # Someone's update holds the stack (a lock file where the file backend keeps them, as
    # the engine writes it): reconcile waits its turn, never cancels.
    locks = (project.state / ".pulumi" / "locks" / "organization" / "kimipd" / STACK)
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "held-by-test.json").write_text(
        '{"pid": 4242, "username": "ops", "hostname": "console", "timestamp": "now"}')
    try:
        code, line = reconcile_once(project, STACK, tmp_path, "--grace-seconds", "0",
                                    "--human-window-minutes", "0")
        assert (code, line["decision"]) == (1, "locked"), line
        assert "ops@console pid 4242" in line["message"], line
        assert len(stack.history()) == history and container_ids(sim) == before
    finally:
        (locks / "held-by-test.json").unlink()

    # The policy pack stops each path that changes the stack, with its message, before a node
    # changes. A change it refuses (a privileged container: the program takes it, the pack does
    # not), at `kimipd preview` and `kimipd up`:
    values = yaml.safe_load((project.directory / f"Pulumi.{STACK}.yaml").read_text())["config"]
    project.update_stack(STACK, {"container": values["kimipd:container"] | {"privileged": True}})
    try:
        for command in (["preview"], ["up", "--yes"]):
            refused = kimipd(project, STACK, *command)
            output = refused.stdout + refused.stderr
            assert refused.returncode != 0, output[-3000:]
            assert "kimipd-no-privileged" in output and "mandatory" in output.lower(), \
                output[-3000:]
    finally:
        project.update_stack(STACK, {"container": values["kimipd:container"]})
    # A deployed stack the pack now refuses (the operator's pack config for this stack says its
    # NCCL interface is the management one; nothing in the stack's config changes, so nothing is
    # pending): the heal's up stops, and the pass names the policy.
    operator_file = project.directory / f"Pulumi.{STACK}.policy.json"
    operator_file.write_text(json.dumps(
        {"kimipd-nccl-off-management": {"managementInterface": "bond1"}}))
    try:
        # Its state file is the next pass's: the failed heal's refresh dropped the dead rank from
        # the state, and only reconcile's own retry may apply that pending create.
        code, line = reconcile_once(project, STACK, tmp_path, "--grace-seconds", "0",
                                    "--human-window-minutes", "0", "--backoff-seconds", "0")
        assert (code, line["decision"], line["units"]) == (REFUSED, "heal-failed", [GROUP]), line
        assert any(failure["error"].startswith("policy kimipd-nccl-off-management (mandatory)")
                   for failure in line.get("failures", [])), line
    finally:
        operator_file.unlink()
    assert container_ids(sim) == before, "a change the policy pack refused touched a node"

    code, line = reconcile_once(project, STACK, tmp_path, "--grace-seconds", "0",
                                "--human-window-minutes", "0", "--backoff-seconds", "0")
    assert (code, line["decision"], line["units"]) == (0, "healed", [GROUP]), line
    assert_replaced_only(before, container_ids(sim), f"kimipd-{GROUP}-")
    newest = stack.history(page_size=2)
    assert [entry.kind for entry in newest] == ["update", "refresh"]
    assert all(entry.message.startswith(f"kimipd reconcile: heal {GROUP}") for entry in newest)
    assert {url} <= healthy_workers(SMALL_ROUTER)
    selected = subprocess.run([project.env["PULUMI_BIN"], "stack", "--show-name"],
                              cwd=project.directory, env=os.environ | project.env,
                              capture_output=True, text=True)
    assert selected.stdout.strip() == "bystander", selected.stdout + selected.stderr
    stack.workspace.remove_stack("bystander")
    # status sends the router's key with its whole-path probe (401 without it).
    status, report = settled_status(project, STACK)
    assert (status.returncode, report["verdict"], report["generate"]["status"]) == \
        (0, "serving", 200), (report["generate"], status_problems(report))


def test_a_restarted_group_loading_is_left_alone_within_its_bound_then_replaced(
        stack: auto.Stack, sim: SimCluster, project: Project, url: str, tmp_path: Path) -> None:
    """decode-b's container restarted (a node that rebooted, a restart policy) loads for 10
    minutes: its port answers /health 503 "loading model". reconcile --watch, its grace 4 s,
    logs `loading` and touches nothing while the group is up for less than its load bound; past
    the bound the group is hung, and replaced (a new container loads in seconds)."""
    with reconcile_service(project, STACK, tmp_path, max_heals=1) as service:
        log = service["log.jsonl"]
        wait_until_logged(log, "healthy", "a first healthy pass")
        written = sim.docker(NODE, "exec", CONTAINER, "sh", "-c", f"echo 600 > {LOAD_FILE}")
        assert written.returncode == 0, written.stderr
        assert sim.docker(NODE, "restart", "--time", "5", CONTAINER).returncode == 0
        restarted_at = time.time()
        before = container_ids(sim)
        loading = wait_until_logged(log, "loading", "a pass that waits for decode-b's load",
                                    units=[GROUP])
        assert f"{GROUP} loading: up " in loading["message"], loading
        assert f"of its {LOAD_BOUND_SECONDS}s load bound" in loading["message"], loading
        healed = wait_until_logged(log, "healed", "decode-b replaced past its load bound",
                                   units=[GROUP], seconds=LOAD_BOUND_SECONDS + 180)
    lines = decisions(log)
    first = next(i for i, line in enumerate(lines) if line.get("decision") == "loading")
    judged = [line["decision"] for line in lines[first:lines.index(healed)] if "decision" in line]
    heal_start = next(line for line in lines[first:] if line.get("event") == "heal-start")
    began = datetime.fromisoformat(heal_start["time"]).timestamp() - restarted_at
    print(f"restarted decode-b loading: passes {judged}; the heal began {began:.1f}s after the "
          f"restart, took {healed['seconds']}s, replaced {healed.get('replace')}")
    # Within the bound only waiting (`loading`), then the grace of a hung unit and its heal.
    assert judged.count("loading") >= 3 and set(judged) <= {"loading", "grace"}, judged
    # The bound decided, not the grace: rank 0 started before `docker restart` returned.
    assert began >= LOAD_BOUND_SECONDS - 5, f"healed {began:.0f}s into a {LOAD_BOUND_SECONDS}s load"
    after = container_ids(sim)
    assert after[CONTAINER] != before[CONTAINER], "the hung group kept its container"
    assert_replaced_only(before, after, f"kimipd-{GROUP}-")
    assert healed.get("replace") == [f"node-{NODE.replace('.', '-')}-decode"], healed
    wait_until(lambda: url in healthy_workers(SMALL_ROUTER), 60, "decode-b serving again")


HUNG_METRIC = "kimipd_reconcile_hung_since_timestamp_seconds"


def hung_series(metrics: str) -> list[dict[str, str]]:
    """The label sets of reconcile's hung-unit gauge in METRICS (its textfile)."""
    from prometheus_client.parser import text_string_to_metric_families
    return [dict(sample.labels) for family in text_string_to_metric_families(metrics)
            for sample in family.samples if sample.name == HUNG_METRIC]


def assert_hung_alert_fires(labels: dict[str, str], work: Path) -> None:
    """KimipdUnitHungNotHealed, as the observability stack renders it, fires on the series
    reconcile wrote (LABELS, as node_exporter's textfile collector would export them) once
    alerts.hungNotHealedForSeconds has passed: promtool's rule tester, no Prometheus."""
    from observability.config import AlertsSpec
    from observability.rules import RULES_FILE, rules_yaml
    (work / RULES_FILE).write_text(rules_yaml(AlertsSpec(), 2.5, "alerts.ttftSeconds"))
    series = HUNG_METRIC + "{" + ", ".join(
        f'{key}="{value}"' for key, value in sorted(({"job": "node", "instance": "operator:9100"}
                                                     | labels).items())) + "}"
    bound = AlertsSpec().hung_not_healed_for_seconds
    stack, unit, decision = labels["stack"], labels["unit"], labels["decision"]
    test = {"rule_files": [RULES_FILE], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": series, "values": "0x40"}],
        "alert_rule_test": [
            {"eval_time": f"{bound - 30}s", "alertname": "KimipdUnitHungNotHealed",
             "exp_alerts": []},
            {"eval_time": f"{bound + 30}s", "alertname": "KimipdUnitHungNotHealed",
             "exp_alerts": [{
                 "exp_labels": {"severity": "critical", "job": "node",
                                "instance": "operator:9100", **labels},
                 # What the person paged reads: the unit, and why reconcile leaves it.
                 "exp_annotations": {
                     "summary": f"{unit} of {stack} is hung (running, not serving) and reconcile "
                                f"does not heal it: {decision}",
                     "action": f"scripts/kimipd status -s {stack}; reconcile's log says why "
                               f"({decision}, docs/healing.md); scripts/kimipd logs -s {stack} "
                               f"--role {unit}"}}]}]}]}
    (work / "hung.test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(["promtool", "test", "rules", "hung.test.yml"], cwd=work,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def service(project: Project, tmp_path: Path) -> Iterator[dict]:
    """A service of the test's own, whose limit is one heal of a unit an hour."""
    with reconcile_service(project, STACK, tmp_path, max_heals=1) as files:
        yield files


def test_watch_heals_a_killed_decode_rank_under_load_then_stops_at_the_limit(
        stack: auto.Stack, sim: SimCluster, url: str, service: dict, tmp_path: Path) -> None:
    log = service["log.jsonl"]
    first = wait_until_logged(log, "healthy", "a first healthy pass")
    # What the router sees is logged beside the decision.
    assert first["routerSees"] == {worker: "healthy"
                                   for worker in healthy_workers(SMALL_ROUTER)}, first
    assert len(first["routerSees"]) == 4, first
    # Another stack's container on the same node, exited: never touched.
    stranger = sim.docker(NODE, "run", "--name", "other-decode-b-r0",
                          "--label", "kimipd.role=decode-b-r0", "--network", "none",
                          "--entrypoint", "true", sim.image)
    assert stranger.returncode == 0, stranger.stderr
    stranger_before = container_ids(sim)["other-decode-b-r0"]
    before = container_ids(sim)
    run = heal_under_load(sim, log, GROUP, url, SMALL_ROUTER,
                          lambda: kill_server(sim, NODE, CONTAINER))
    failed = run.failed_since_broken()
    results = run.results
    lines = decisions(log)
    healed = [d for d in lines if d.get("decision") == "healed"]
    print(f"heal under load: kill -> serving again {run.back_at - run.broken_at:.1f}s; "
          f"{len(results)} requests, {len(failed)} failed {failed}; heal "
          f"{healed[0]['seconds'] if healed else '-'}s")
    assert [d["units"] for d in healed] == [[GROUP]], lines
    assert len(results) > 50
    # A sequential client has one request in flight: at most that one may fail.
    assert len(failed) <= 1, f"failed beyond the request in flight on {GROUP}: {failed}"
    after = container_ids(sim)
    for name, state in before.items():
        if not name.startswith(f"kimipd-{GROUP}-"):
            assert after.get(name) == state, f"{name} changed when only {GROUP} was healed"
    assert after["other-decode-b-r0"] == stranger_before
    sim.docker(NODE, "rm", "-f", "other-decode-b-r0")

    metrics = service["reconcile.prom"].read_text()
    assert f'kimipd_reconcile_heals_total{{stack="{STACK}",unit="{GROUP}"}} 1' in metrics
    checked = subprocess.run(["promtool", "check", "metrics"], input=metrics, text=True,
                             capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The second failure within the hour, a hang this time (its process stopped, its container
    # running, /health unanswered): refused at --max-heals-per-hour 1, left alone, and exported
    # as a hung unit reconcile does not heal, which KimipdUnitHungNotHealed fires on.
    replaced = container_ids(sim)[CONTAINER]
    stop_server(sim, NODE, CONTAINER)
    limited = wait_until_logged(log, "limited", "the limit's refusal of decode-b alone",
                                units=[GROUP])
    assert limited["exitCode"] == 2, limited
    assert "healed 1 times in the last hour (limit 1" in limited["message"], limited
    time.sleep(6)
    assert container_ids(sim)[CONTAINER] == replaced, "healed past the limit"
    assert not any(d.get("event") == "heal-start" and d["units"] == [GROUP]
                   for d in decisions(log)[lines.index(healed[0]) + 1:])
    hung = hung_series(service["reconcile.prom"].read_text())
    assert [(labels["stack"], labels["unit"], labels["decision"]) for labels in hung] == \
        [(STACK, GROUP, "limited")], hung
    assert_hung_alert_fires(hung[0], tmp_path)
    # Dead, as before: the module's destroy then takes an exited group, not a hung one.
    kill_server(sim, NODE, CONTAINER)

    # The passphrase is in the service's environment only: no command line, no log line.
    process = service["process"]
    command_lines = [line for pid in [process.pid] + descendants(process.pid)
                     if (line := command_line(pid)) is not None]
    assert command_lines, "the service has no process"
    assert not any(PASSPHRASE.encode() in line for line in command_lines)
    assert PASSPHRASE not in log.read_text()
    process.send_signal(signal.SIGTERM)
    assert process.wait(120) == 0


def wait_until_logged(log: Path, decision: str, what: str,
                      units: list[str] | None = None, seconds: float = 120) -> dict:
    """The first DECISION logged (of UNITS alone, if given), within SECONDS."""
    return wait_until(lambda: [d for d in decisions(log) if d.get("decision") == decision
                               and (units is None or d["units"] == units)], seconds, what)[0]
