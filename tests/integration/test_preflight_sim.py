"""The rendered preflight, run over a sim node's real sshd: each check that decides the first
attempt on real nodes fails once, with its message, and the sim stack as configured passes.

What a check reads is made real on the node for the test: an address on the management
interface (bond0), a fake sysfs tree with a port that is not ACTIVE (`--sysfs-root`, the nodes
share this machine's filesystem), a model directory without config.json, a port held by a
foreign process in the node's network namespace, and one held by a kimipd-* container.
Nothing is sent anywhere but the sim's own 10.231.60.x addresses.
"""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from components.assets import ASSETS_DIR
from components.config import ClusterConfig, load_cluster_config
from components.render import preflight_command
from tests.conftest import stack_values
from tests.integration.sim import SimCluster, start_sim, stop_sim

pytestmark = pytest.mark.timeout(600)

SCRIPT = (ASSETS_DIR / "preflight.sh").read_text()
PROBE_CONTAINER = "kimipd-preflight-probe"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    cluster = start_sim()
    yield cluster
    stop_sim(cluster)


def sim_config(change: Callable[[dict[str, Any]], None] | None = None) -> ClusterConfig:
    values = copy.deepcopy(stack_values("sim"))
    if change is not None:
        change(values)
    return load_cluster_config(values)


def run_preflight(sim: SimCluster, config: ClusterConfig, address: str, *, on: str | None = None,
                  extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The command the Node component runs for ADDRESS, over SSH to node ON (default ADDRESS);
    EXTRA flags go after the rendered ones (`--sysfs-root` only: a test hook, never rendered)."""
    command = preflight_command(config, address, SCRIPT)
    if extra:
        line, heredoc = command.split(" <<", 1)
        command = f"{line} {shlex.join(extra)} <<{heredoc}"
    return sim.ssh(on or address, command, timeout=120)


def failures(result: subprocess.CompletedProcess, check: str) -> list[str]:
    return [line for line in result.stderr.splitlines() if f": {check}: " in line]


def wait_listening(number: int, port: int) -> None:
    """Until node NUMBER's network namespace has a listener on PORT (10 s at most)."""
    for _ in range(100):
        listeners = subprocess.run(["ip", "netns", "exec", f"kpd-node{number}", "ss", "-Hltn",
                                    f"sport = :{port}"], capture_output=True, text=True,
                                   check=False).stdout
        if listeners.strip():
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port} in kpd-node{number} after 10 s")


@contextmanager
def foreign_listener(number: int, port: int) -> Iterator[subprocess.Popen]:
    """A process that is not ours holding PORT on sim node NUMBER's compute address."""
    # `ip netns exec` execs the command, so this pid is the listener's.
    process = subprocess.Popen(["ip", "netns", "exec", f"kpd-node{number}", "python3", "-m",
                                "http.server", str(port), "--bind", f"10.231.60.{number}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(number, port)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def our_container(sim: SimCluster, number: int, port: int) -> Iterator[None]:
    """A kimipd-* container (host networking, like the stack's) holding PORT on node NUMBER."""
    node = f"10.231.60.{number}"
    sim.docker(node, "rm", "--force", PROBE_CONTAINER)
    pull = sim.docker(node, "pull", "--quiet", sim.image)
    assert pull.returncode == 0, f"docker pull on {node}: {pull.stderr}"
    try:
        run = sim.docker(node, "run", "--detach", "--name", PROBE_CONTAINER, "--network", "host",
                         sim.image, "python3", "-m", "http.server", str(port), "--bind", node)
        assert run.returncode == 0, f"docker run on {node}: {run.stderr}"
        wait_listening(number, port)
        yield
    finally:
        sim.docker(node, "rm", "--force", PROBE_CONTAINER)


def test_the_sim_stack_as_configured_passes_on_every_node(sim: SimCluster) -> None:
    config = sim_config()
    for node in config.nodes:
        address = node.address
        result = run_preflight(sim, config, address)
        assert result.returncode == 0, f"preflight on {address}:\n{result.stderr}"
        assert f"preflight {address}: address: ok ({address} on bond1)" in result.stdout
        assert f"preflight {address}: ports: ok (" in result.stdout
        assert f"preflight {address}: all checks passed" in result.stdout


def test_an_address_on_the_management_interface_fails(sim: SimCluster) -> None:
    # Node 3 declared by its bond0 address (10.231.61.3): what 174.1.60.x on bond0 looks like.
    def on_bond0(values: dict[str, Any]) -> None:
        values.update(json.loads(json.dumps(values).replace('"10.231.60.3"', '"10.231.61.3"')))

    result = run_preflight(sim, sim_config(on_bond0), "10.231.61.3", on="10.231.60.3")
    assert result.returncode == 1
    assert failures(result, "address") == [
        "preflight failed on node 10.231.61.3: address: 10.231.61.3 is on bond0, not on bond1 "
        "(bond1 has 10.231.60.3/24); the other ranks, the router and the KV handshakes dial "
        "10.231.61.3, so they would not use bond1: assign 10.231.61.3 to bond1, or set this "
        "node's address in `nodes` to its bond1 address"]


def test_an_address_on_no_interface_fails(sim: SimCluster) -> None:
    # Node 3's preflight run on node 4: 10.231.60.3 is not there at all.
    result = run_preflight(sim, sim_config(), "10.231.60.3", on="10.231.60.4")
    assert result.returncode == 1
    assert failures(result, "address")[0].startswith(
        "preflight failed on node 10.231.60.3: address: 10.231.60.3 is on no interface of this "
        "node (bond1 has 10.231.60.4/24)")


def test_an_rdma_port_not_active_fails(sim: SimCluster, tmp_path: Path) -> None:
    for device in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"):
        port = tmp_path / "sys" / "class" / "infiniband" / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
    (tmp_path / "dev-infiniband").mkdir()

    def rdma_on(values: dict[str, Any]) -> None:
        values["preflight"]["checkRdma"] = True
        values["container"]["devices"] = [str(tmp_path / "dev-infiniband")]

    config = sim_config(rdma_on)
    sysfs = ("--sysfs-root", str(tmp_path / "sys"))
    result = run_preflight(sim, config, "10.231.60.2", extra=sysfs)
    assert result.returncode == 0, result.stderr
    assert ("preflight 10.231.60.2: rdma: ok (mlx5_0,mlx5_1,mlx5_2,mlx5_3 ACTIVE)"
            in result.stdout)
    assert f"preflight 10.231.60.2: devices: ok ({tmp_path}/dev-infiniband)" in result.stdout

    (tmp_path / "sys/class/infiniband/mlx5_2/ports/1/state").write_text("1: DOWN\n")
    result = run_preflight(sim, config, "10.231.60.2", extra=sysfs)
    assert result.returncode == 1
    assert failures(result, "rdma") == [
        "preflight failed on node 10.231.60.2: rdma: mlx5_2 port 1 is DOWN (not ACTIVE); bring "
        "the link up (ibstat, cable, switch port) or remove the device from network.rdmaDevices"]


def test_a_missing_container_device_fails(sim: SimCluster, tmp_path: Path) -> None:
    missing = str(tmp_path / "infiniband")

    def devices(values: dict[str, Any]) -> None:
        values["preflight"]["checkRdma"] = True
        values["container"]["devices"] = [missing]

    # The sim has no RDMA devices: the rdma check fails too, and is not what this test is about.
    result = run_preflight(sim, sim_config(devices), "10.231.60.6")
    assert result.returncode == 1
    assert failures(result, "devices") == [
        f"preflight failed on node 10.231.60.6: devices: {missing} not found (container.devices; "
        "docker would refuse to start the ranks); load the RDMA drivers (mlx5_ib, rdma-core) or "
        "remove it from container.devices"]


def test_a_model_without_config_json_fails(sim: SimCluster, tmp_path: Path) -> None:
    model = tmp_path / "models" / "Kimi-K3"
    model.mkdir(parents=True)

    def model_volume(values: dict[str, Any]) -> None:
        values["container"]["volumes"] = [{"hostPath": str(tmp_path / "models"),
                                           "containerPath": "/data/models"}]

    config = sim_config(model_volume)
    result = run_preflight(sim, config, "10.231.60.7")
    assert result.returncode == 1
    assert failures(result, "model") == [
        f"preflight failed on node 10.231.60.7: model: no config.json in {model} (the node side "
        "of model.path): the copy is incomplete or model.path names the wrong directory; copy "
        "the whole model, or fix model.path"]

    (model / "config.json").write_text("{}")
    result = run_preflight(sim, config, "10.231.60.7")
    assert result.returncode == 0, result.stderr
    assert f"preflight 10.231.60.7: model: ok ({model}/config.json)" in result.stdout


# Ports no running deployment on the sim uses, so the tests do not depend on what else runs there.
def unusual_ports(values: dict[str, Any]) -> None:
    values["groups"]["prefill"]["httpPort"] = 30917
    values["groups"]["decode"] |= {"httpPort": 30918, "distInitPort": 20900}
    values["router"]["port"] = 31918


def test_a_port_held_by_a_foreign_process_fails(sim: SimCluster) -> None:
    config = sim_config(unusual_ports)
    with foreign_listener(3, 30917) as listener:
        result = run_preflight(sim, config, "10.231.60.3")
    assert result.returncode == 1
    assert failures(result, "ports") == [
        "preflight failed on node 10.231.60.3: ports: port 30917 (groups.prefill.httpPort) is "
        f"held by python3 pid {listener.pid}, not by a kimipd-* container; stop that process, "
        "or set groups.prefill.httpPort to a free port"]
    # Stopped: the port is free again.
    assert run_preflight(sim, config, "10.231.60.3").returncode == 0


def test_a_port_held_by_our_container_passes_and_a_foreign_one_beside_it_fails(
        sim: SimCluster) -> None:
    config = sim_config(unusual_ports)
    with our_container(sim, 5, 30918):
        with foreign_listener(5, 31918) as listener:
            result = run_preflight(sim, config, "10.231.60.5")
        assert result.returncode == 1
        # The container's port is not named: its listener lives in kimipd-preflight-probe.
        assert failures(result, "ports") == [
            "preflight failed on node 10.231.60.5: ports: port 31918 (router.port) is held by "
            f"python3 pid {listener.pid}, not by a kimipd-* container; stop that process, or set "
            "router.port to a free port"]
        result = run_preflight(sim, config, "10.231.60.5")
    assert result.returncode == 0, result.stderr
    assert (f"held by this stack's containers: 30918:{PROBE_CONTAINER})" in result.stdout)
