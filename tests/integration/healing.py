"""What the heal tests share (test_heal.py on the shared 2P2D stack, test_heal_decisions.py on a
small one): faults on a node's container, reconcile's decision log, one pass of `kimipd
reconcile`, the systemd unit's `reconcile --watch`, and a load through the door while a group
breaks and heals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sim.automation import Project
from tests.conftest import REPO
from tests.integration.engine import AUTHORIZED, container_ids, generate_loop, kimipd
from tests.integration.sim import SimCluster
from tests.ops.loopback import wait_until
from tests.ops.systemd_unit import SERVICE_BASE_ENV, environment_file, exec_start

PASSPHRASE = "kimipd-tests"  # sim/automation.Project's


def server_pid(sim: SimCluster, node: str, container: str) -> int:
    """The server process inside CONTAINER (its PID 1: launch.sh execs it), as this machine
    numbers it (the nodes' engines run in its PID namespace)."""
    pid = sim.docker(node, "inspect", "-f", "{{.State.Pid}}", container).stdout.strip()
    assert pid and pid != "0", f"{container} on {node} is not running"
    return int(pid)


def kill_server(sim: SimCluster, node: str, container: str) -> float:
    """SIGKILL to the server process inside CONTAINER (its PID 1: launch.sh execs it), as an
    OOM killer or a GPU fault would; returns when it was sent (time.monotonic())."""
    os.kill(server_pid(sim, node, container), signal.SIGKILL)
    return time.monotonic()


def stop_server(sim: SimCluster, node: str, container: str) -> float:
    """SIGSTOP to the server process inside CONTAINER: alive, its container running, answering
    nothing (what a rank stuck in a collective looks like from outside); the SIGKILL of a later
    `docker rm -f` ends a stopped process as any other. Returns when it was sent."""
    os.kill(server_pid(sim, node, container), signal.SIGSTOP)
    state = sim.docker(node, "inspect", "--format", "{{.State.Status}}", container)
    assert state.stdout.strip() == "running", state.stdout
    return time.monotonic()


def wait_exited(sim: SimCluster, node: str, container: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sim.docker(node, "inspect", "-f", "{{.State.Status}}", container).stdout.strip() \
                == "exited":
            return
        time.sleep(0.2)
    raise AssertionError(f"{container} on {node} still not exited {timeout}s after the kill")


def healthy_workers(router: str) -> set[str]:
    """The URLs ROUTER (a slot, or the door in front of them) lists as healthy."""
    request = urllib.request.Request(router + "/workers", headers=AUTHORIZED)
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


def reconcile_once(project: Project, stack: str, directory: Path,
                   *args: str) -> tuple[int, dict]:
    """One pass of `kimipd reconcile` on STACK, its log and state in DIRECTORY: (exit code,
    its one decision)."""
    log = directory / "once.jsonl"
    log.unlink(missing_ok=True)
    result = kimipd(project, stack, "reconcile", "--log", str(log), "--state-file",
                    str(directory / "once-state.json"), *args, timeout=900)
    lines = [line for line in decisions(log) if "decision" in line]
    assert len(lines) == 1, f"one decision per pass: {lines}\n{result.stderr}"
    return result.returncode, lines[0]


@contextmanager
def reconcile_service(project: Project, stack: str, directory: Path,
                      max_heals: int) -> Iterator[dict]:
    """reconcile --watch on STACK started from the unit's ExecStart and an environment file
    written as docs/healing.md says (mode 0600), with the environment systemd gives a root
    service; files in DIRECTORY, at most MAX_HEALS heals of a unit an hour."""
    files = {name: directory / name for name in ("log.jsonl", "state.json", "reconcile.prom")}
    env_file = directory / f"reconcile-{stack}.env"
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
    process = subprocess.Popen(exec_start(stack, environment), cwd=REPO,
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


def heal_under_load(sim: SimCluster, log: Path, group: str, url: str, router: str,
                    fault: Callable[[], float], since: int = 0) -> HealUnderLoad:
    """Load through ROUTER, FAULT (which returns when it struck) 3 s in, then until GROUP's
    containers are all new, running and its rank 0 (URL) healthy in the router, and reconcile
    logged `healed` (after LOG's first SINCE lines)."""
    before = container_ids(sim)
    stop, results, times = threading.Event(), [], []
    loader = threading.Thread(target=generate_loop, args=(stop, results, 100000, times),
                              kwargs={"router": router}, daemon=True)
    loader.start()
    try:
        time.sleep(3)
        broken_at = fault()

        def serving_again() -> bool:
            ids = container_ids(sim)  # a container being replaced is missing for a moment
            replaced = all(ids.get(name, before[name]) != before[name]
                           and ids[name].endswith("running")
                           for name in before if name.startswith(f"kimipd-{group}-"))
            return replaced and url in healthy_workers(router)

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


def command_line(pid: int) -> bytes | None:
    """PID's command line; None once it has exited (a child between its listing and its read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None


def descendants(pid: int) -> list[int]:
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    found = [int(p) for p in children.stdout.split()]
    return found + [grand for child in found for grand in descendants(child)]
