"""Healing without a human, through the real engine on the sim with the rust router (stack file
Pulumi.sim-2p2d.yaml): a dry run, a person's recent update, `serving: false` in the config and
someone else's lock change nothing; one pass heals a killed group; `reconcile --watch`, started
from the systemd unit's own ExecStart line and environment file, heals a decode rank killed
with SIGKILL under load, and refuses the second heal of the hour. Tests run in file order on
test_rollout.py's stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from pulumi import automation as auto

from sim.automation import Project
from tests.conftest import REPO
from tests.integration.engine import (  # noqa: F401 - fixtures
    AUTHORIZED, ROUTER, SHARED_2P2D, container_ids, generate_loop, kimipd, shared_2p2d,
    settled_status, shared_2p2d_project, shared_2p2d_sim, shared_2p2d_stack,
    status_problems)
from tests.integration.sim import SimCluster
from tests.ops.loopback import wait_until
from tests.ops.systemd_unit import SERVICE_BASE_ENV, environment_file, exec_start

pytestmark = pytest.mark.timeout(1800)

STACK = SHARED_2P2D
DECODE = {"decode-a": ("10.231.60.5", "10.231.60.6"), "decode-b": ("10.231.60.7", "10.231.60.8")}
PASSPHRASE = "kimipd-tests"  # sim/automation.Project's


def kill_server(sim: SimCluster, node: str, container: str) -> float:
    """SIGKILL to the server process inside CONTAINER (its PID 1: launch.sh execs it), as an
    OOM killer or a GPU fault would; returns when it was sent (time.monotonic())."""
    pid = sim.docker(node, "inspect", "-f", "{{.State.Pid}}", container).stdout.strip()
    assert pid and pid != "0", f"{container} on {node} is not running"
    os.kill(int(pid), signal.SIGKILL)
    return time.monotonic()


def wait_exited(sim: SimCluster, node: str, container: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sim.docker(node, "inspect", "-f", "{{.State.Status}}", container).stdout.strip() \
                == "exited":
            return
        time.sleep(0.2)
    raise AssertionError(f"{container} on {node} still not exited {timeout}s after the kill")


def healthy_workers() -> set[str]:
    request = urllib.request.Request(ROUTER + "/workers", headers=AUTHORIZED)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            listing = json.load(response)
    except (OSError, ValueError):
        return set()
    return {w["url"] for w in listing.get("workers", []) if w.get("is_healthy")}


def decisions(log: Path, since: int = 0) -> list[dict]:
    """LOG's lines from the SINCE-th on (a count of lines taken before)."""
    if not log.exists():
        return []
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines[since:]]


def reconcile_once(project: Project, tmp_path: Path, *args: str) -> tuple[int, dict]:
    log = tmp_path / "once.jsonl"
    log.unlink(missing_ok=True)
    result = kimipd(project, STACK, "reconcile", "--log", str(log), "--state-file",
                    str(tmp_path / "once-state.json"), *args, timeout=900)
    lines = [line for line in decisions(log) if "decision" in line]
    assert len(lines) == 1, f"one decision per pass: {lines}\n{result.stderr}"
    return result.returncode, lines[0]


def test_a_dry_run_and_a_recent_update_change_nothing_then_one_pass_heals(
        stack: auto.Stack, project: Project, sim: SimCluster, tmp_path: Path) -> None:
    # The operator's selected stack is another one; reconcile names its stack, never selects.
    project.stack("bystander")
    node = DECODE["decode-b"][0]
    kill_server(sim, node, "kimipd-decode-b-r0")
    wait_exited(sim, node, "kimipd-decode-b-r0")
    before, history = container_ids(sim), len(stack.history())

    # The fixture's `up` was a person's: hands off for the window, even past the grace.
    code, line = reconcile_once(project, tmp_path, "--dry-run", "--grace-seconds", "0")
    assert (code, line["decision"], line["units"]) == (1, "human-window", ["decode-b"]), line
    code, line = reconcile_once(project, tmp_path, "--dry-run", "--grace-seconds", "0",
                                "--human-window-minutes", "0")
    assert (code, line["decision"], line["units"]) == (1, "would-heal", ["decode-b"]), line
    assert "exited" in " ".join(line["details"]["problems"]["decode-b"])
    assert container_ids(sim) == before, "a dry run changed a container"
    assert len(stack.history()) == history, "a dry run ran an update"
    assert not (tmp_path / "once-state.json").exists(), "a dry run wrote its state"

    # The config says the stack should be down (not applied yet): never healed.
    project.update_stack(STACK, {"serving": False})
    try:
        code, line = reconcile_once(project, tmp_path, "--grace-seconds", "0",
                                    "--human-window-minutes", "0")
        assert (code, line["decision"]) == (0, "not-serving"), line
        assert len(stack.history()) == history and container_ids(sim) == before
    finally:
        project.update_stack(STACK, {"serving": True})

    # Someone's update holds the stack (a lock file where the file backend keeps them, as
    # the engine writes it): reconcile waits its turn, never cancels.
    locks = (project.state / ".pulumi" / "locks" / "organization" / "kimipd" / STACK)
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "held-by-test.json").write_text(json.dumps(
        {"pid": 4242, "username": "ops", "hostname": "console", "timestamp": "now"}))
    try:
        code, line = reconcile_once(project, tmp_path, "--grace-seconds", "0",
                                    "--human-window-minutes", "0")
        assert (code, line["decision"]) == (1, "locked"), line
        assert "ops@console pid 4242" in line["message"], line
        assert len(stack.history()) == history and container_ids(sim) == before
    finally:
        (locks / "held-by-test.json").unlink()

    code, line = reconcile_once(project, tmp_path, "--grace-seconds", "0",
                                "--human-window-minutes", "0")
    assert (code, line["decision"], line["units"]) == (0, "healed", ["decode-b"]), line
    after = container_ids(sim)
    for name, state in before.items():
        if name.startswith("kimipd-decode-b-"):
            assert after[name] != state and after[name].endswith("running"), name
        else:
            assert after[name] == state, f"{name} changed when only decode-b was healed"
    newest = stack.history(page_size=2)
    assert [entry.kind for entry in newest] == ["update", "refresh"]
    assert all(entry.message.startswith("kimipd reconcile: heal decode-b") for entry in newest)
    assert {f"http://{DECODE['decode-b'][0]}:30000"} <= healthy_workers()
    selected = subprocess.run([project.env["PULUMI_BIN"], "stack", "--show-name"],
                              cwd=project.directory, env=os.environ | project.env,
                              capture_output=True, text=True)
    assert selected.stdout.strip() == "bystander", selected.stdout + selected.stderr
    stack.workspace.remove_stack("bystander")
    # status sends the router's key with its whole-path probe (401 without it).
    status, report = settled_status(project, STACK)
    assert (status.returncode, report["verdict"], report["generate"]["status"]) == \
        (0, "serving", 200), (report["generate"], status_problems(report))


@contextmanager
def reconcile_service(project: Project, directory: Path, max_heals: int) -> Iterator[dict]:
    """reconcile --watch started from the unit's ExecStart and an environment file written as
    docs/healing.md says (mode 0600), with the environment systemd gives a root service; files
    in DIRECTORY, at most MAX_HEALS heals of a unit an hour."""
    files = {name: directory / name for name in ("log.jsonl", "state.json", "reconcile.prom")}
    env_file = directory / f"reconcile-{STACK}.env"
    env_file.write_text(
        f"PULUMI_BACKEND_URL={project.env['PULUMI_BACKEND_URL']}\n"
        f"PULUMI_CONFIG_PASSPHRASE={PASSPHRASE}\n"
        f"KIMIPD_PULUMI_ENV={os.environ.get('KIMIPD_PULUMI_ENV', '')}\n"
        f"KIMIPD_RECONCILE_ARGS=--cwd {project.directory} --interval 2 --grace-seconds 4 "
        f"--max-heals-per-hour {max_heals} --human-window-minutes 0 --log {files['log.jsonl']} "
        f"--state-file {files['state.json']} --metrics-file {files['reconcile.prom']}\n")
    env_file.chmod(0o600)
    environment = environment_file(env_file.read_text())
    if not environment["KIMIPD_PULUMI_ENV"]:
        environment.pop("KIMIPD_PULUMI_ENV")
    base = dict(SERVICE_BASE_ENV)
    if "KIMIPD_CACHE" in os.environ:
        base["KIMIPD_CACHE"] = os.environ["KIMIPD_CACHE"]
    process = subprocess.Popen(exec_start(STACK, environment), cwd=REPO,
                               env=base | environment, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        yield files | {"process": process}
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        print(process.stdout.read() if process.stdout else "")


@pytest.fixture
def service(project: Project, tmp_path: Path) -> Iterator[dict]:
    """A service of the test's own, whose limit is one heal of a unit an hour."""
    with reconcile_service(project, tmp_path, max_heals=1) as files:
        yield files


@pytest.fixture(scope="class")
def frozen_service(project: Project, tmp_path_factory) -> Iterator[dict]:
    """One service for the frozen-rank tests, which heal decode-b once each: starting one (its
    first pass refreshes the 8-node stack) cost each of them half a minute. Each test reads the
    decisions logged after it started (`decisions(log, since)`)."""
    # Ten: the limit is test_watch_heals_a_killed_decode_rank's to prove; here a heal of what an
    # earlier test left broken must not use up the heals these three are about.
    with reconcile_service(project, tmp_path_factory.mktemp("frozen-heals"),
                           max_heals=10) as files:
        yield files


@dataclass
class HealUnderLoad:
    """A sequential client's answers (RESULTS, with when each was sent and answered: TIMES)
    while GROUP broke and reconcile healed it; when the fault came and when the group served
    whole again (time.monotonic())."""

    results: list[int]
    times: list[tuple[float, float]]
    broken_at: float
    back_at: float

    def failed_since_broken(self) -> list[tuple[float, int]]:
        """(seconds after the fault it was sent, status) of each request that failed."""
        return [(round(sent - self.broken_at, 1), status)
                for (sent, _), status in zip(self.times, self.results) if status != 200]


def heal_under_load(sim: SimCluster, log: Path, group: str,
                    fault: Callable[[], float], since: int = 0) -> HealUnderLoad:
    """Load through the door, FAULT (which returns when it struck) 3 s in, then until GROUP's
    containers are all new, running and healthy in the router, and reconcile logged `healed`
    (after LOG's first SINCE lines)."""
    before = container_ids(sim)
    url = f"http://{DECODE[group][0]}:30000"
    stop, results, times = threading.Event(), [], []
    loader = threading.Thread(target=generate_loop, args=(stop, results, 100000, times),
                              daemon=True)
    loader.start()
    try:
        time.sleep(3)
        broken_at = fault()

        def serving_again() -> bool:
            ids = container_ids(sim)  # a container being replaced is missing for a moment
            replaced = all(ids.get(name, before[name]) != before[name]
                           and ids[name].endswith("running")
                           for name in before if name.startswith(f"kimipd-{group}-"))
            return replaced and url in healthy_workers()

        wait_until(serving_again, 600, f"{group} replaced and healthy in the router")
        back_at = time.monotonic()
        # The up goes on after the admission (the smoke test): its decision comes after.
        wait_until(lambda: [d for d in decisions(log, since) if d.get("decision") == "healed"],
                   120, "reconcile's healed decision")
        time.sleep(3)
    finally:
        stop.set()
        loader.join(30)
    return HealUnderLoad(results, times, broken_at, back_at)


class TestFrozenRank:
    """The frozen-rank heals, on one reconcile service (`frozen_service`, stopped after the
    class: the next test starts a service of its own)."""

    @pytest.mark.parametrize(("how", "rank"), [("pause", 0), ("pause", 1), ("sigstop", 0)])
    def test_watch_replaces_a_group_with_a_paused_rank_under_load(
            self, stack: auto.Stack, sim: SimCluster, frozen_service: dict, how: str,
            rank: int) -> None:
        """One rank of decode-b frozen: `docker pause` (docker says paused), or SIGSTOP of the
        server's process itself (docker says running: what a rank stuck in a collective looks like
        from outside). The group hangs (the stand-in stalls as SGLang's collectives do: rank 0's
        /health goes unanswered or 503), refresh sees no drift, and reconcile replaces exactly
        decode-b's containers by name (`up --replace`), with no person. The three share one
        service (`frozen_service`): each reads what was logged after it began."""
        log = frozen_service["log.jsonl"]
        started = len(decisions(log))
        wait_until(lambda: [d for d in decisions(log, started) if d.get("decision") == "healthy"],
                   120, "a healthy pass")
        # What this test judges: what the service logs once every unit served (not a heal of
        # something an earlier test left broken).
        since = len(decisions(log))
        before = container_ids(sim)
        node, container = DECODE["decode-b"][rank], f"kimipd-decode-b-r{rank}"

        def freeze() -> float:
            if how == "pause":
                paused = sim.docker(node, "pause", container)
                assert paused.returncode == 0, paused.stderr
            else:
                # The server is the container's PID 1 (launch.sh execs it); the nodes' engines run
                # in this machine's PID namespace, so docker's Pid is this machine's. SIGKILL from
                # the heal's `docker rm -f` ends a stopped process as any other.
                pid = sim.docker(node, "inspect", "--format", "{{.State.Pid}}", container)
                assert pid.returncode == 0 and int(pid.stdout) > 0, pid.stderr
                os.kill(int(pid.stdout), signal.SIGSTOP)
                state = sim.docker(node, "inspect", "--format", "{{.State.Status}}", container)
                assert state.stdout.strip() == "running", state.stdout
            return time.monotonic()

        run = heal_under_load(sim, log, "decode-b", freeze, since)
        lines = decisions(log, since)
        healed = [d for d in lines if d.get("decision") == "healed"]
        failed = run.failed_since_broken()
        back = run.back_at - run.broken_at
        print(f"{how} of decode-b rank {rank}: serving whole again after {back:.1f}s; "
              f"{len(run.results)} requests, {len(failed)} failed {failed}; "
              f"heal {healed[0]['seconds'] if healed else '-'}s, replaced "
              f"{healed[0].get('replace') if healed else '-'}")
        assert [d["units"] for d in healed] == [["decode-b"]], lines
        assert sorted(healed[0]["replace"]) == [f"node-{address.replace('.', '-')}-decode"
                                                for address in DECODE["decode-b"]], healed[0]
        assert not [d for d in lines if d.get("decision") == "healed" and not d.get("replace")]
        after = container_ids(sim)
        for name, state in before.items():
            if not name.startswith("kimipd-decode-b-"):
                assert after.get(name) == state, f"{name} changed when only decode-b was replaced"
        # Only requests the slots sent to decode-b before they stopped choosing it fail (each waits
        # out the client's 10 s): none sent once it serves again.
        assert len(run.results) > 20
        assert all(sent < back for sent, _ in failed), failed
        # The hang is seen after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) or the probe's timeout, the
        # grace is 4 s, the drain of a hung group waits out drainTimeoutSeconds (60 s), then one
        # group load (3 s) and the admission: 240 s is twice that.
        assert back < 240, f"serving whole again only after {back:.0f}s"


def test_watch_heals_a_killed_decode_rank_under_load_then_stops_at_the_limit(
        stack: auto.Stack, sim: SimCluster, service: dict) -> None:
    log = service["log.jsonl"]
    first = wait_until(lambda: [d for d in decisions(log) if d.get("decision") == "healthy"],
                       120, "a first healthy pass")[0]
    # What the router sees is logged beside the decision.
    assert first["routerSees"] == {url: "healthy" for url in healthy_workers()}, first
    assert len(first["routerSees"]) == 4, first
    # Another stack's container on the same node, exited: never touched.
    stranger = sim.docker(DECODE["decode-a"][1], "run", "--name", "other-decode-a-r1",
                          "--label", "kimipd.role=decode-a-r1", "--network", "none",
                          "--entrypoint", "true", sim.image)
    assert stranger.returncode == 0, stranger.stderr
    stranger_before = container_ids(sim)["other-decode-a-r1"]
    before = container_ids(sim)
    run = heal_under_load(sim, log, "decode-a", lambda: kill_server(
        sim, DECODE["decode-a"][1], "kimipd-decode-a-r1"))
    failed = run.failed_since_broken()
    results = run.results
    lines = decisions(log)
    healed = [d for d in lines if d.get("decision") == "healed"]
    print(f"heal under load: kill -> serving again {run.back_at - run.broken_at:.1f}s; "
          f"{len(results)} requests, {len(failed)} failed {failed}; heal "
          f"{healed[0]['seconds'] if healed else '-'}s")
    assert [d["units"] for d in healed] == [["decode-a"]], lines
    assert len(results) > 50
    # A sequential client has one request in flight: at most that one may fail.
    assert len(failed) <= 1, f"failed beyond the request in flight on decode-a: {failed}"
    after = container_ids(sim)
    for name, state in before.items():
        if not name.startswith("kimipd-decode-a-"):
            assert after.get(name) == state, f"{name} changed when only decode-a was healed"
    assert after["other-decode-a-r1"] == stranger_before
    sim.docker(DECODE["decode-a"][1], "rm", "-f", "other-decode-a-r1")

    metrics = service["reconcile.prom"].read_text()
    assert f'kimipd_reconcile_heals_total{{stack="{STACK}",unit="decode-a"}} 1' in metrics
    checked = subprocess.run(["promtool", "check", "metrics"], input=metrics, text=True,
                             capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The second death within the hour: refused at --max-heals-per-hour 1, and left alone.
    kill_server(sim, DECODE["decode-a"][0], "kimipd-decode-a-r0")
    # decode-a's rank 0 shares router.node with the door, keepalived and slot a: a pass taken
    # while that node's engine handles the kill once saw them broken too (the refusal named all
    # four); what must hold is a refusal of decode-a alone once the node settles.
    limited = wait_until(lambda: [d for d in decisions(log) if d.get("decision") == "limited"
                                  and d["units"] == ["decode-a"]],
                         120, "the limit's refusal of decode-a alone")[0]
    assert limited["exitCode"] == 2, limited
    assert "healed 1 times in the last hour (limit 1" in limited["message"], limited
    time.sleep(6)
    assert container_ids(sim)["kimipd-decode-a-r0"].endswith("exited"), "healed past the limit"
    assert not any(d.get("event") == "heal-start" and d["units"] == ["decode-a"]
                   for d in decisions(log)[lines.index(healed[0]) + 1:])

    # The passphrase is in the service's environment only: no command line, no log line.
    process = service["process"]
    command_lines = [line for pid in [process.pid] + _descendants(process.pid)
                     if (line := _command_line(pid)) is not None]
    assert command_lines, "the service has no process"
    assert not any(PASSPHRASE.encode() in line for line in command_lines)
    assert PASSPHRASE not in log.read_text()
    process.send_signal(signal.SIGTERM)
    assert process.wait(120) == 0
    # decode-a stays dead: the fixture's destroy takes a stack with a dead group down as well.


def _command_line(pid: int) -> bytes | None:
    """PID's command line; None once it has exited (a child between its listing and its read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _descendants(pid: int) -> list[int]:
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    found = [int(p) for p in children.stdout.split()]
    return found + [grand for child in found for grand in _descendants(child)]
