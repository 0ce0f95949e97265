"""The renderings, run for real on the simulated cluster, without the Pulumi engine.

Each container is started with exactly its ContainerPlan (argv, env, mounts, labels) by the
node's own docker over SSH, and the program's own scripts do the rest: preflight, the readiness
gates, the smoke test. What runs: real sshd and dockerd per node, the local registry, the real
sglang-router (MiniLB), the real mooncake_master, and the stand-in SGLang server. This proves the
flags, environment and ordering the program renders are accepted and work end to end; the
Pulumi layer on top is covered by tests/program (mocks) and tests/integration/test_up.py (engine).
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from components.assets import ASSETS_DIR, verify_node_file_sources
from components.config import ClusterConfig, load_cluster_config
from components.render import (
    NODE_ASSET_DIR,
    NODE_SCRIPTS,
    ContainerPlan,
    mooncake_master_plan,
    prepare_dirs_command,
    prepare_image_command,
    prepared_image_id,
    prepared_image_tag,
    preflight_command,
    router_plan,
    sglang_rank_plan,
    smoke_test_command,
    smoke_test_text,
    wait_healthy_command,
)
from tests.conftest import stack_values
from tests.integration.engine import small_layout, with_minilb
from tests.integration.sim import SMALL_NODES, SimCluster, start_sim, stop_sim

pytestmark = pytest.mark.timeout(1800)


def docker_run_argv(plan: ContainerPlan, image: str) -> list[str]:
    """What the docker provider asks the engine for, as `docker run` flags."""
    argv = ["docker", "run", "--detach", "--name", plan.name, "--network", "host", "--ipc", "host",
            "--restart", plan.restart, "--shm-size", f"{plan.shm_size_mb}m"]
    for key, value in sorted(plan.env.items()):
        argv += ["--env", f"{key}={value}"]
    for key, value in plan.labels.items():
        argv += ["--label", f"{key}={value}"]
    for host, container, read_only in plan.mounts:
        argv += ["--volume", f"{host}:{container}{':ro' if read_only else ''}"]
    for name, limit in plan.ulimits.items():
        argv += ["--ulimit", f"{name}={limit}:{limit}"]
    argv += [f"--device={device}" for device in plan.devices]
    argv += [f"--cap-add={capability}" for capability in plan.capabilities]
    argv += ["--gpus", plan.gpus] if plan.gpus else []
    argv += ["--privileged"] if plan.privileged else []
    argv += ["--runtime", plan.runtime] if plan.runtime else []
    return [*argv, image, *plan.command]


class Deployment:
    """Drives one sim deployment in the program's order, reporting failures in operator terms."""

    def __init__(self, sim: SimCluster, config: ClusterConfig) -> None:
        self.sim, self.config = sim, config
        self.nodes = [node.address for node in config.nodes]
        self.run_images: dict[str, str] = {}  # node -> the prepared image's id
        self.builds: dict[str, object] = {}  # node -> prepare-image.sh's result

    def prepare_nodes(self, nodes: list[str] | None = None, check_build: bool = True) -> None:
        """What NodeAssets, RemoteImage and the prepared image do: dirs, scripts, node files,
        the image, and (installNodeFiles: image) the node's prepared image; every node at once,
        as the engine prepares them."""
        digests = verify_node_file_sources(self.config.node_files, Path.cwd())
        files = {f"{NODE_ASSET_DIR}/{s}": ASSETS_DIR / s for s in NODE_SCRIPTS}
        files |= {f.destination: Path(f.source).expanduser() for f in self.config.node_files}
        scripts = {s: (ASSETS_DIR / s).read_text() for s in NODE_SCRIPTS}
        targets = nodes or self.nodes
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            for done in [pool.submit(self._prepare_node, node, files, digests, scripts,
                                     check_build) for node in targets]:
                done.result()  # the first node's failure, raised here

    def _prepare_node(self, node: str, files: dict[str, Path], digests: dict[str, str],
                      scripts: dict[str, str], check_build: bool) -> None:
        self.check(node, self.sim.ssh(node, prepare_dirs_command(self.config)), "dirs")
        for destination, source in files.items():
            self.check(node, self.sim.copy(node, source, destination), f"copy {destination}")
        self.check(node, self.sim.docker(node, "pull", "--quiet", self.sim.image), "pull")
        if self.config.install_node_files != "image":
            return
        base = self.sim.docker(node, "image", "inspect", "--format", "{{.Id}}",
                               self.sim.image).stdout.strip()
        tag = prepared_image_tag(self.config, base, digests, scripts)
        build = self.sim.ssh(node, prepare_image_command(
            self.config, node, base, tag, "sim-renderings", digests))
        self.builds[node] = build
        if check_build:
            self.check(node, build, "prepared image")
            self.run_images[node] = prepared_image_id(build.stdout)

    @staticmethod
    def check(node: str, result, what: str) -> None:
        assert result.returncode == 0, f"{what} on {node} failed:\n{result.stdout}\n{result.stderr}"

    def start(self, plan: ContainerPlan) -> None:
        image = self.run_images.get(plan.node, self.sim.image)
        result = self.sim.ssh(plan.node, shlex.join(docker_run_argv(plan, image)))
        self.check(plan.node, result, f"docker run {plan.role}")

    def gate(self, plan: ContainerPlan):
        return self.sim.ssh(plan.node, wait_healthy_command(self.config, plan))

    def gate_group(self, plans: list[ContainerPlan]):
        """Every rank's check, as HealthGate runs them (each on its own node); the first failure
        or the last success."""
        results = [self.gate(plan) for plan in plans]
        return next((result for result in results if result.returncode != 0), results[-1])

    def start_group(self, name: str) -> list[ContainerPlan]:
        plans = [sglang_rank_plan(self.config, name, rank)
                 for rank in range(len(self.config.groups[name].nodes))]
        for plan in plans:
            self.start(plan)
        return plans

    def logs(self, plan: ContainerPlan) -> str:
        result = self.sim.docker(plan.node, "logs", plan.name)
        return result.stdout + result.stderr


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    """The four small nodes (engine.small_layout): the module runs beside the 8-node ones."""
    cluster = start_sim(SMALL_NODES)
    yield cluster
    cluster.remove_kimipd_containers(SMALL_NODES)
    stop_sim(cluster)


def runbook_values() -> dict:
    """Stack sim on the small nodes with the runbook's MiniLB: this module starts the containers
    by hand in the runbook's order, router last; the rust router's key files and memberships are
    the program's (test_security.py, test_rollout.py)."""
    return with_minilb(small_layout(copy.deepcopy(stack_values("sim"))))


def sim_config(sim: SimCluster, **changes) -> ClusterConfig:
    values = runbook_values()
    values["image"] = sim.image
    for key, value in changes.items():
        values[key] = value
    return load_cluster_config(values)


@pytest.fixture(scope="module")
def deployed(sim: SimCluster) -> Iterator[tuple[Deployment, dict]]:
    deployment = Deployment(sim, sim_config(sim))
    sim.remove_kimipd_containers(deployment.nodes)
    for node in deployment.nodes:  # so that every node builds its prepared image here
        sim.ssh(node, "docker image ls --quiet --filter label=kimipd.prepared=1 "
                      "| xargs --no-run-if-empty docker rmi --force >/dev/null")
    deployment.prepare_nodes()
    master = mooncake_master_plan(deployment.config)
    deployment.start(master)
    gates = {"mooncake-master": deployment.gate(master)}
    prefill = deployment.start_group("prefill")
    gates["prefill"] = deployment.gate_group(prefill)
    decode = deployment.start_group("decode") if gates["prefill"].returncode == 0 else []
    gates["decode"] = deployment.gate_group(decode) if decode else None
    router = router_plan(deployment.config)
    deployment.start(router)
    gates["router"] = deployment.gate(router)
    smoke = deployment.sim.ssh(router.node, smoke_test_command(deployment.config))
    yield deployment, {"gates": gates, "smoke": smoke, "prefill": prefill, "decode": decode,
                       "router": router, "master": master}
    sim.remove_kimipd_containers(deployment.nodes)


def test_preflight_passes_on_every_sim_node(sim: SimCluster) -> None:
    config = sim_config(sim)
    script = (ASSETS_DIR / "preflight.sh").read_text()
    for node in [n.address for n in config.nodes]:
        result = sim.ssh(node, preflight_command(config, node, script))
        assert result.returncode == 0, f"preflight on {node}:\n{result.stderr}"
        assert f"preflight {node}: all checks passed" in result.stdout


def test_preflight_failure_names_node_and_check(sim: SimCluster) -> None:
    values = runbook_values()
    values["network"]["computeInterface"] = "bond7"
    config = load_cluster_config(values)
    node = SMALL_NODES[1]
    result = sim.ssh(node, preflight_command(
        config, node, (ASSETS_DIR / "preflight.sh").read_text()))
    assert result.returncode == 1
    assert f"preflight failed on node {node}: compute-interface: bond7 not found" in result.stderr


def test_every_gate_opens_in_order(deployed) -> None:
    _, run = deployed
    for name, gate in run["gates"].items():
        assert gate is not None and gate.returncode == 0, f"{name} gate:\n{gate and gate.stderr}"
        assert "healthy after" in gate.stdout, name


def test_smoke_test_answer_comes_from_decode_through_the_router(deployed) -> None:
    _, run = deployed
    smoke = run["smoke"]
    assert smoke.returncode == 0, smoke.stderr
    response = json.loads(smoke.stdout)
    assert smoke_test_text(smoke.stdout).strip()
    # The KV came from prefill rank 0's bootstrap server, which the router named.
    assert response["meta_info"]["kv_transfer"]["bootstrap_host"] == SMALL_NODES[0]


def test_each_rank_ran_its_rendered_command(deployed) -> None:
    deployment, run = deployed
    for plan in run["prefill"] + run["decode"]:
        inspect = deployment.sim.docker(plan.node, "inspect", "--format",
                                        "{{json .Config.Cmd}} {{.State.Status}}", plan.name)
        command, status = inspect.stdout.rsplit(" ", 1)
        assert json.loads(command) == plan.command, plan.role
        assert status.strip() == "running", f"{plan.role} on {plan.node} is {status.strip()}"
        logs = deployment.logs(plan)
        # The node files went into the prepared image; the container only execs its server.
        assert "launch.sh: installing" not in logs and "launch.sh: exec python3" in logs, plan.role
        assert "flags parsed by the real SGLang 0.5.19 parser" in logs, plan.role


def test_each_prepared_image_installed_the_node_files_and_proved_mooncake(deployed) -> None:
    deployment, _ = deployed
    assert set(deployment.builds) == set(deployment.nodes)
    for node, build in deployment.builds.items():
        log = build.stderr
        assert "launch.sh: installing" in log and "patch_k3_sm120 (sim): applied" in log, node
        # The image's 0.3.11.post1 (another distribution) is gone; the wheel's release is proven.
        assert "uninstalling mooncake-transfer-engine (the image's Mooncake)" in log, node
        assert ("Mooncake 0.3.13.post1 (mooncake-transfer-engine-non-cuda)" in log
                and "ok (>= 0.3.12.post1)" in log), node
        assert deployment.sim.docker(node, "image", "inspect", "--format",
                                     "{{index .Config.Labels \"kimipd.stack\"}}",
                                     deployment.run_images[node]).stdout.strip() == "sim-renderings"


def test_every_rank_serves_its_health_port(deployed) -> None:
    deployment, run = deployed
    for plan in run["prefill"] + run["decode"]:
        probe = deployment.sim.ssh(plan.node, f"curl -fsS -o /dev/null -w '%{{http_code}}' "
                                              f"{plan.health_url}")
        assert probe.stdout == "200", f"{plan.role} {plan.health_url}: {probe.stderr}"


def test_mooncake_master_is_the_real_one_and_pid_1(deployed) -> None:
    """launch.sh execs the wheel's binary: docker's SIGTERM reaches the master itself."""
    deployment, run = deployed
    master = run["master"]
    pid1 = deployment.sim.docker(master.node, "exec", master.name, "ps", "-o", "args=", "-p", "1")
    assert pid1.stdout.strip().startswith(
        "/opt/venv/lib/python3.11/site-packages/mooncake/mooncake_master --rpc_port 50051 "
        f"--rpc_address {SMALL_NODES[0]}"), pid1.stdout + pid1.stderr
    logs = deployment.logs(master)
    assert "launch.sh: installing" not in logs  # the prepared image has it already


def test_installing_at_container_start_gives_the_master_only_the_mooncake_wheel(
        sim: SimCluster) -> None:
    values = runbook_values()
    values |= {"image": sim.image, "installNodeFiles": "container-start"}
    deployment = Deployment(sim, load_cluster_config(values))
    master = mooncake_master_plan(deployment.config)
    sim.remove_kimipd_containers([master.node])
    try:
        deployment.prepare_nodes([master.node])
        assert not deployment.builds  # nothing built: launch.sh installs at start
        deployment.start(master)
        gate = deployment.gate(master)
        assert gate.returncode == 0, gate.stderr
        logs = deployment.logs(master)
        assert "launch.sh: installing" in logs and "ok (>= 0.3.12.post1)" in logs
        assert "patch_k3_sm120" not in logs and "flash_kda" not in logs  # only the Mooncake wheel
    finally:
        sim.remove_kimipd_containers([master.node])


def test_the_launch_check_refuses_the_images_old_mooncake(sim: SimCluster) -> None:
    """An operator who declares the image fixed (imageMooncakeVersion) and ships no wheel: the
    image really has 0.3.11.post1, and the rank refuses to start, naming it."""
    values = runbook_values()
    values["image"] = sim.image
    values["nodeFiles"] = [f for f in values["nodeFiles"] if "mooncake" not in f["destination"]]
    values["imageMooncakeVersion"] = "0.3.12.post1"
    values["installNodeFiles"] = "container-start"
    deployment = Deployment(sim, load_cluster_config(values))
    plan = sglang_rank_plan(deployment.config, "decode", 1)
    sim.remove_kimipd_containers([plan.node])
    try:
        deployment.prepare_nodes([plan.node])
        deployment.start(plan)
        gate = deployment.gate(plan)
        assert gate.returncode == 1
        assert f"kimipd-decode-r1 on {plan.node}: not running: exited (exit code 1)" in gate.stderr
        assert ("Python imports Mooncake 0.3.11.post1 (mooncake-transfer-engine" in gate.stderr
                and "runbook rule 3: Mooncake >= 0.3.12.post1" in gate.stderr), gate.stderr
    finally:
        sim.remove_kimipd_containers([plan.node])


def test_the_prepared_image_refuses_the_images_old_mooncake_before_anything_starts(
        sim: SimCluster) -> None:
    """The same mistake with installNodeFiles: image: node preparation fails, naming the
    release, and no image is tagged (so no container could run it)."""
    values = runbook_values()
    values["image"] = sim.image
    values["nodeFiles"] = [f for f in values["nodeFiles"] if "mooncake" not in f["destination"]]
    values["imageMooncakeVersion"] = "0.3.12.post1"
    deployment = Deployment(sim, load_cluster_config(values))
    node = SMALL_NODES[3]
    deployment.prepare_nodes([node], check_build=False)
    build = deployment.builds[node]
    assert build.returncode == 1
    assert (f"prepared image on node {node}: building kimipd/prepared:" in build.stderr
            and "Python imports Mooncake 0.3.11.post1 (mooncake-transfer-engine" in build.stderr
            and "runbook rule 3: Mooncake >= 0.3.12.post1" in build.stderr), build.stderr
    tag = build.stderr.split("building ", 1)[1].split(" ", 1)[0]
    assert sim.docker(node, "image", "inspect", tag).returncode != 0


def test_a_prefill_rank_dying_while_loading_fails_its_gate_with_its_log(sim: SimCluster) -> None:
    """Rank 1, not rank 0: its own check names its node and container."""
    values = runbook_values()
    values["image"] = sim.image
    values["groups"]["prefill"]["env"] = {"SGLANG_STANDIN_EXIT_WHILE_LOADING": "1"}
    values["gates"] = {"timeoutSeconds": 60, "intervalSeconds": 1}
    deployment = Deployment(sim, load_cluster_config(values))
    sim.remove_kimipd_containers(deployment.nodes)
    try:
        deployment.prepare_nodes()
        prefill = deployment.start_group("prefill")
        gate = deployment.gate(prefill[1])
        node = SMALL_NODES[1]
        assert gate.returncode == 1
        assert f"kimipd-prefill-r1 on {node}: not running: exited (exit code 1)" in gate.stderr
        assert f"last 100 lines of kimipd-prefill-r1 on {node}:" in gate.stderr
        assert "CUDA out of memory" in gate.stderr
    finally:
        sim.remove_kimipd_containers(deployment.nodes)
