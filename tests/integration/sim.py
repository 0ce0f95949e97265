"""The simulated cluster (sim/sim) as a test fixture: real sshd, dockerd, registry and image."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sim.automation import sim_exports
from tests.conftest import REPO

SIM = REPO / "sim" / "sim"
# The shipped stacks' nodes (Pulumi.sim*.yaml), and the four a session of small stacks uses:
# nodes 9-12, or 13-16 where KIMIPD_SMALL_NODES_FROM says 13. Each set has an engine session of
# its own beside the 8-node one (scripts/test), so the small modules run in two halves at once.
SHIPPED_NODES = [f"10.231.60.{i}" for i in range(1, 9)]
SMALL_SETS = (9, 13)
SMALL_FROM = int(os.environ.get("KIMIPD_SMALL_NODES_FROM", "9"))
if SMALL_FROM not in SMALL_SETS:
    raise SystemExit(f"KIMIPD_SMALL_NODES_FROM={SMALL_FROM}: the sim's small node sets begin at "
                     f"{' or '.join(map(str, SMALL_SETS))}; set one of those, or unset it")
SMALL_NODES = [f"10.231.60.{i}" for i in range(SMALL_FROM, SMALL_FROM + 4)]


def _sim(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([str(SIM), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


@dataclass
class SimCluster:
    env: dict[str, str]
    started_here: bool
    # The nodes this module's stacks use: what it lists and clears, and nothing else.
    nodes: list[str] = field(default_factory=lambda: list(SHIPPED_NODES))

    @property
    def image(self) -> str:
        """The sim's current image: `sim/sim up` rebuilds it when sim/standin changes (and prunes
        older tags), so it is read afresh rather than remembered."""
        return sim_exports()["KIMIPD_SIM_IMAGE"]

    @property
    def door_image(self) -> str:
        """The door's image (HAProxy from Debian's package), pinned: `sim/sim build-door-image`
        builds it once per its inputs and prints REPO@DIGEST."""
        return _built_image("build-door-image")

    @property
    def keepalived_image(self) -> str:
        """The virtual IP's image (keepalived from Debian's package), pinned, as the door's."""
        return _built_image("build-keepalived-image")

    def ssh(self, node: str, command: str, timeout: int = 600,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run a shell line on a sim node over its real sshd (DOCKER_HOST is the node's dockerd)."""
        return subprocess.run(["ssh", "-F", self.env["KIMIPD_SIM_SSH_CONFIG"], f"root@{node}",
                               command], capture_output=True, text=True, timeout=timeout,
                              input=stdin, check=False)

    def copy(self, node: str, source: Path, destination: str) -> subprocess.CompletedProcess:
        with source.open("rb") as stream:
            return subprocess.run(["ssh", "-F", self.env["KIMIPD_SIM_SSH_CONFIG"], f"root@{node}",
                                   f"cat > {shlex.quote(destination)}"], stdin=stream,
                                  capture_output=True, timeout=120, check=False)

    def stop_dockerd(self, number: int) -> None:
        """Stop node N's dockerd only (the nodes share one process space: no pkill)."""
        self._stop_daemon(number, "dockerd")

    def stop_sshd(self, number: int) -> None:
        """Node N unreachable: its sshd stopped (`start_node` or `restart_sim` starts it again)."""
        self._stop_daemon(number, "sshd")

    @staticmethod
    def start_node(number: int) -> None:
        """Node N's stopped daemons again, and nothing else: `restart_sim` would also restore what
        a test of the other engine session broke on purpose (a node's link)."""
        result = _sim("start-node", str(number), timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]

    @staticmethod
    def _stop_daemon(number: int, daemon: str) -> None:
        pid = int(Path(f"/run/kimipd-sim/node{number}/{daemon}.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)

    def docker(self, node: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return self.ssh(node, shlex.join(["docker", *args]), timeout=timeout)

    @staticmethod
    def local_docker(node: str, *args: str) -> subprocess.CompletedProcess:
        """docker on NODE through its engine's socket on this host: reaches a node whose link
        on the sim bridge is cut."""
        socket_path = f"/run/kimipd-sim/node{node.rsplit('.', 1)[-1]}/docker.sock"
        return subprocess.run(["docker", "-H", f"unix://{socket_path}", *args],
                              capture_output=True, text=True, timeout=60)

    def remove_kimipd_containers(self, nodes: list[str]) -> None:
        """Every node at once."""
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            list(pool.map(lambda node: self.ssh(
                node, "ids=$(docker ps -aq --filter label=kimipd.role); "
                      '[ -z "$ids" ] || docker rm -f $ids >/dev/null'), nodes))


# Whether this pytest session brought the sim up: it then brings it down at the end (the
# session fixture in tests/conftest.py), once, not after every module.
_session = {"checked": False, "started": False}


def start_sim(nodes: list[str] | None = None) -> SimCluster:
    """The sim, up and with a current image (`sim/sim up` is idempotent and rebuilds the image
    when sim/standin changed); left as it was found when the session ends."""
    # scripts/test brought it up before the engine sessions, with the working tree's images: an
    # `up` again from each session would run beside the other session's tests.
    if not _session["checked"] and os.environ.get("KIMIPD_SIM_UP_BY") != "scripts/test":
        _session["started"] = _sim("status").returncode != 0
        result = _sim("up")
        assert result.returncode == 0, f"sim/sim up failed:\n{result.stderr[-4000:]}"
    _session["checked"] = True
    nodes = list(nodes or SHIPPED_NODES)
    status = _sim("status")
    # Nothing may be sent to 10.231.60.x unless the sim's bridge carries it. Only NODES are
    # this module's: the other session may have one of its own nodes cut off or stopped on
    # purpose (test_door's node loss), which is no reason to fail here.
    problems = sim_status_problems(status.stdout, nodes)
    assert status.stdout.strip() and not problems, (
        f"the sim is not up ({'; '.join(problems)}):\n{status.stdout}{status.stderr}")
    return SimCluster(env=sim_exports(), started_here=_session["started"], nodes=nodes)


def sim_status_problems(report: str, nodes: list[str]) -> list[str]:
    """What `sim/sim status` says is not up, of NODES' rows and the registry and image rows."""
    problems, seen = [], set()
    for line in report.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0].startswith("node") and fields[1] in nodes:
            seen.add(fields[1])
            if any(state != "up" for state in fields[2:]):
                problems.append(line.strip())
        elif fields and fields[0] == "registry" and "up" not in fields[2:]:
            problems.append(line.strip())
        elif fields and fields[0] == "image" and "present" not in fields[2:]:
            problems.append(line.strip())
    problems += [f"{node}: no row" for node in nodes if node not in seen]
    return problems


def restart_sim() -> None:
    """`sim/sim up` again: restarts whatever a test stopped (idempotent for the rest)."""
    result = _sim("up")
    assert result.returncode == 0, result.stderr[-4000:]


def stop_sim(cluster: SimCluster) -> None:
    """Kept for the modules' teardown; the sim goes down once, at the end of the session."""


def stop_sim_at_session_end() -> None:
    if _session["started"]:
        _sim("down")


def _built_image(command: str) -> str:
    """REPO@DIGEST of one of the sim's images of Debian packages (`sim/sim COMMAND` builds it
    once per its inputs)."""
    result = _sim(command, timeout=900)
    assert result.returncode == 0, f"sim/sim {command}:\n{result.stderr[-3000:]}"
    return result.stdout.strip().splitlines()[-1]
