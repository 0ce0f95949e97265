"""`scripts/kimipd` against a stack the real engine deployed on the simulated cluster.

The tool runs as the operator runs it: the wrapper, the pulumi CLI reading the stack's outputs
and config (the SSH key from the encrypted secret), paramiko to the nodes' real sshd with the
pinned host keys, HTTP to the nodes' addresses. The stand-ins run at configured speeds, so
verify's figures can be checked. The stack is small (engine.small_values: a prefill and a decode
group of two nodes, nodes 9-12), so the module runs beside the 8-node ones. Tests run in file
order; the last one kills a decode rank.
Run only under the sim lock: `flock -o /tmp/kimipd-sim-tests.lock scripts/test tests/integration/test_ops_sim.py`.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulumi import automation as auto

from ops.remote import RemoteError, SshTransport, load_private_key
from ops.stack import Access
from sim.automation import Project
from tests.integration import engine
from tests.integration.sim import SIM, SMALL_NODES, SimCluster
from tests.ops.loopback import wait_until
from tests.integration.engine import status_problems
# The engine tests' fixtures and helpers (the sim, a project on a file backend, a stack on it).
from tests.integration.engine import (  # noqa: F401 - fixtures
    SMALL_ROUTER, container_ids, env, new_stack, project, small_sim, small_values)

pytestmark = pytest.mark.timeout(1800)

PREFILL_RATE = 2000.0  # prompt tokens/s
DECODE_RATE = 150.0  # output tokens/s
STACK = "ops"
NODES = SMALL_NODES
PREFILL_NODES, DECODE_NODES = NODES[:2], NODES[2:]
ROLES = ["mooncake-master", *[f"prefill-r{r}" for r in range(2)],
         *[f"decode-r{r}" for r in range(2)], "door", "router-a", "router-b"]
# The door is not restarted by a restartGeneration bump (it would refuse every request while
# it restarts: docs/door.md), so it carries no generation label.
NO_GENERATION = {"door"}


def _standin_in_image_is_current() -> bool:
    # `sim/sim status` notes when the image predates its inputs (sim/standin among them).
    status = subprocess.run([str(SIM), "status"], capture_output=True, text=True, timeout=120)
    return "inputs changed since the last build" not in status.stdout


@pytest.fixture(scope="module")
def stack(project: Project, sim: SimCluster) -> Iterator[auto.Stack]:
    if not _standin_in_image_is_current():
        pytest.skip("the sim image predates sim/standin (no simulated speeds, no streaming): "
                    "rebuild it with `sim/sim build-image` or `sim/sim up`")
    values = small_values(sim)
    values["groups"]["prefill"].setdefault("env", {})["SGLANG_STANDIN_PREFILL_TOKENS_PER_S"] = (
        str(PREFILL_RATE))
    values["groups"]["decode"].setdefault("env", {})["SGLANG_STANDIN_DECODE_TOKENS_PER_S"] = (
        str(DECODE_RATE))
    deployed = new_stack(project, sim, STACK, values)
    deployed.up()
    yield deployed
    deployed.destroy()


def kimipd(project: Project, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return engine.kimipd(project, STACK, *args, timeout=timeout)


def test_status_all_serving(stack: auto.Stack, project: Project, sim: SimCluster) -> None:
    table = kimipd(project, "status")
    assert table.returncode == 0, table.stdout + table.stderr
    assert "stack ops: serving" in table.stdout and "8/8 containers ok; exit 0" in table.stdout
    result = kimipd(project, "status", "--json")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    rows = {row["role"]: row for row in report["containers"]}
    assert list(rows) == ROLES
    for role, row in rows.items():
        generation = None if role in NO_GENERATION else "0"
        assert (row["state"], row["restartGeneration"], row["health"]["status"],
                row["health"]["via"], row["ok"]) == ("running", generation, 200, "direct",
                                                     True), row
        assert row["container"] == f"kimipd-{role}" and row["uptimeSeconds"] >= 0
    assert rows["decode-r1"]["node"] == DECODE_NODES[1]
    # every node's firewall table is there (stack sim has one on every node)
    assert report["firewall"] == dict.fromkeys(NODES, "present")
    assert report["generate"]["status"] == 200
    assert report["generate"]["url"] == SMALL_ROUTER + "/generate"
    # each group's load, as its gate measured it, and the load bound that follows from it:
    # twice that, at least 120 s, at most what the gate waits (gates.timeoutSeconds)
    gate_timeout = json.loads(stack.get_config("kimipd:gates").value)["timeoutSeconds"]
    for name, group in stack.outputs()["groups"].value.items():
        last = group["lastLoadSeconds"]
        assert isinstance(last, int) and 0 <= last < gate_timeout, (name, group)
        assert group["loadBoundSeconds"] == min(gate_timeout, max(120, 2 * last)), (name, group)
    # the key came from the encrypted secret and stayed in memory
    key = Path(sim.env["KIMIPD_SIM_KEY"]).read_text().strip().splitlines()[1]
    assert key not in table.stdout + table.stderr + result.stdout + result.stderr


def test_status_over_ssh_on_the_nodes(stack: auto.Stack, project: Project) -> None:
    result = kimipd(project, "status", "--via", "ssh", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, (status_problems(report), result.stderr)
    assert {row["health"]["via"] for row in report["containers"]} == {"ssh"}
    assert report["generate"]["via"] == "ssh" and report["generate"]["status"] == 200


def test_verify_reproduces_the_configured_speeds(stack: auto.Stack, project: Project) -> None:
    table = kimipd(project, "verify")
    assert table.returncode == 0, table.stdout + table.stderr
    result = kimipd(project, "verify", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    requests = {r["name"]: r for r in json.loads(result.stdout)["requests"]}
    assert list(requests) == ["warmup", "medium", "long"]
    for request in requests.values():
        assert (request["status"], request["outputTokensReceived"]) == (
            200, request["outputTokens"]), request
    for name in ("medium", "long"):
        prefill = requests[name]["prefillTokensPerSecond"]
        decode = requests[name]["decodeTokensPerSecond"]
        # Never faster than configured (the stand-in paces from the request's arrival), but for
        # a first token read late, which shortens the decode's measured time; a busy machine
        # only makes them slower. The figures within 10 %: scripts/bench --only B8.
        assert 0 < prefill <= PREFILL_RATE / 0.95, (name, prefill)
        assert 0 < decode < 3 * DECODE_RATE, (name, decode)


def test_verify_fails_against_a_baseline_it_cannot_meet(stack: auto.Stack,
                                                        project: Project) -> None:
    project.update_stack(STACK, {"verification": {"tolerance": 0.1, "baseline": [
        {"name": "medium", "inputTokens": 1680, "outputTokens": 512, "maxE2eSeconds": 2.0,
         # Far past what the stand-in decodes: a late first token then caught up measures fast.
         "minDecodeTokensPerSecond": 10 * DECODE_RATE},
        {"name": "long", "inputTokens": 5280, "outputTokens": 256,
         "minPrefillTokensPerSecond": PREFILL_RATE / 2}]}})
    result = kimipd(project, "verify")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "verify regression" in result.stdout
    assert "e2e " in result.stdout and "> 2s +10%" in result.stdout
    assert f"< {10 * DECODE_RATE:g} -10%" in result.stdout


def test_logs_bundle_has_every_container(stack: auto.Stack, project: Project,
                                         tmp_path: Path) -> None:
    result = kimipd(project, "logs", "--out", str(tmp_path), "--since", "30m")
    assert result.returncode == 0, result.stdout + result.stderr
    (bundle,) = tmp_path.glob("kimipd-logs-ops-*.tar.gz")
    with tarfile.open(bundle) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode(errors="replace")
                 for m in tar.getmembers()}
    index = json.loads(files["index.json"])
    assert {c["role"] for c in index["containers"]} == set(ROLES)
    assert index["nodes"] == NODES and index["failed"] == 0
    for container in index["containers"]:
        log = files[f"{container['node']}/{container['container']}.log"]
        assert log.strip(), f"{container['container']}: empty log"
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", log), log[:80]  # --timestamps
        inspect = json.loads(files[f"{container['node']}/{container['container']}.inspect.json"])
        assert inspect[0]["Name"] == "/" + container["container"]
    assert ("The server is fired up and ready to roll!"
            in files[f"{DECODE_NODES[0]}/kimipd-decode-r0.log"])
    for node in NODES:
        assert "kimipd-" in files[f"{node}/docker-ps.txt"]
        entries = {e["what"]: e["status"] for e in index["files"] if e["node"] == node}
        # no GPUs or HCAs on the sim: noted, not an error
        assert {entries[what] for what in ("nvidia-smi", "ibstat", "rdma link")} <= {
            "absent", "ok", "nonzero"}, entries
    assert "INDEX.txt" in files
    narrowed = kimipd(project, "logs", "--out", str(tmp_path / "decode"), "--role", "decode")
    assert narrowed.returncode == 0
    (decode_bundle,) = (tmp_path / "decode").glob("*.tar.gz")
    with tarfile.open(decode_bundle) as tar:
        logs = sorted(m.name.split("/", 1)[1] for m in tar.getmembers() if m.name.endswith(".log"))
    assert logs == [f"{node}/kimipd-decode-r{r}.log" for r, node in enumerate(DECODE_NODES)]


def test_host_keys_are_pinned(sim: SimCluster, tmp_path: Path) -> None:
    key = Path(sim.env["KIMIPD_SIM_KEY"]).read_text()
    load_private_key(key)
    pinned = Path(sim.env["KIMIPD_SIM_KNOWN_HOSTS"]).read_text().splitlines()
    ok = SshTransport(Access(sim.env["KIMIPD_SIM_KNOWN_HOSTS"], {}, key), connect_timeout=5)
    assert ok.run(NODES[0], "hostname", timeout=10).out.strip() == \
        f"kpd-node{NODES[0].rsplit('.', 1)[1]}"
    ok.close()
    # the first small node pinned with the second's key: refused
    swapped = tmp_path / "known_hosts"
    node2_key = next(line for line in pinned if line.startswith(NODES[1] + " ")).split(" ", 1)[1]
    swapped.write_text(f"{NODES[0]} {node2_key}\n")
    with pytest.raises(RemoteError, match="host key differs"):
        SshTransport(Access(str(swapped), {}, key), connect_timeout=5).run(NODES[0], "true", 10)
    # not pinned at all: refused, never learnt
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(RemoteError, match="no host key pinned"):
        SshTransport(Access(str(empty), {}, key), connect_timeout=5).run(NODES[0], "true", 10)
    assert empty.read_text() == ""


def test_a_killed_decode_rank_takes_its_group_down(stack: auto.Stack, project: Project,
                                                   sim: SimCluster) -> None:
    """A TP group cannot run without one of its ranks: the rest of decode break with it (rank 0
    answers 503 or exits), and with one decode group nothing serves: down, exit 2.
    Status names the killed rank's exit and every broken one. (That the rest of a larger group
    exits with it, rank 0 by its watchdog and every other rank with rank 0: the stand-in's own
    tests, sim/standin/tests/test_standin.py.)"""
    killed = sim.docker(DECODE_NODES[1], "kill", "kimipd-decode-r1")
    assert killed.returncode == 0, killed.stderr
    # Rank 0's watchdog ends it once it lost a rank (on the 8-node stack this waited for ranks
    # 1 and 3, which exit with rank 0); status is read once the group has broken whole.
    wait_until(lambda: container_ids(sim).get("kimipd-decode-r0", "").endswith("exited"), 120,
               "decode's rank 0 exited")
    table = kimipd(project, "status")
    assert table.returncode == 2, table.stdout + table.stderr
    result = kimipd(project, "status", "--json")
    assert result.returncode == 2
    report = json.loads(result.stdout)
    rows = {row["role"]: row for row in report["containers"]}
    dead = rows["decode-r1"]
    assert dead["state"] == "exited" and dead["exitCode"] == 137, dead
    assert not dead["ok"] and dead["problems"][0] == "exited (exit 137)"
    # Rank 0 broke with its group: a 503, or gone by now.
    assert not rows["decode-r0"]["ok"], rows["decode-r0"]
    assert report["verdict"] == "down"
    assert rows["prefill-r0"]["ok"] and rows["mooncake-master"]["ok"] and rows["door"]["ok"]
    assert "decode-r1" in table.stdout and "exited (137)" in table.stdout
