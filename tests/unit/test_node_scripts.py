"""The scripts that run on nodes and in containers, run here for real (loopback only)."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import fake_servers
from tests.conftest import REPO

ASSETS = REPO / "assets"


def bash(script: str, *args: str, env: dict | None = None, timeout: int = 60,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ASSETS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, input=stdin, check=False)


def test_scripts_are_shellcheck_clean() -> None:
    assert shutil.which("shellcheck"), "shellcheck is missing: .ci/run installs it"
    scripts = [*ASSETS.glob("*.sh"), REPO / "sim" / "sim", REPO / "sim" / "debian-image.sh",
               REPO / ".ci" / "run",
               *(path for path in (REPO / "scripts").iterdir() if path.is_file())]
    result = subprocess.run(["shellcheck", *sorted(map(str, scripts))],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


# -- preflight ----------------------------------------------------------------------------------


def preflight(*overrides: str, tools: Path | None = None) -> subprocess.CompletedProcess:
    """preflight.sh with every check off but the ones OVERRIDES turn on; TOOLS (a directory of
    fake commands) goes first on PATH."""
    args = dict(zip(*[iter([
        "--node", "10.0.0.9", "--gpus", "0", "--max-gpu-memory-used-mib", "0",
        "--rdma-devices", "", "--compute-interface", "lo", "--nvidia-runtime", "no",
        "--disk-path", "/", "--min-free-disk-gb", "0", "--model-host-path", "",
        "--device-paths", "", "--ports", "", *overrides])] * 2))
    argv = [item for pair in args.items() for item in pair]
    path = f"{tools}:/usr/bin:/bin" if tools else "/usr/bin:/bin"
    # Fed on stdin, exactly as the Node component runs it.
    return subprocess.run(["bash", "-s", "--", *argv], input=(ASSETS / "preflight.sh").read_text(),
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": path, "DOCKER_HOST": "unix:///nonexistent.sock"})


def fake_tool(directory: Path, name: str, script: str) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("#!/bin/sh\n" + script)
    (directory / name).chmod(0o755)
    return directory


def test_preflight_names_node_and_every_failed_check() -> None:
    result = preflight("--gpus", "8", "--rdma-devices", "mlx5_0,mlx5_9",
                       "--compute-interface", "bond9", "--min-free-disk-gb", "999999")
    assert result.returncode == 1
    errors = result.stderr
    assert "preflight failed on node 10.0.0.9: gpus: nvidia-smi not found (expected 8 GPUs)" in errors
    assert "preflight failed on node 10.0.0.9: rdma: missing under /sys/class/infiniband: mlx5_0 mlx5_9" in errors
    assert "preflight failed on node 10.0.0.9: compute-interface: bond9 not found" in errors
    assert "preflight failed on node 10.0.0.9: disk:" in errors and "need 999999 GB" in errors


def test_preflight_reports_an_unreachable_docker_engine() -> None:
    result = preflight()
    if shutil.which("docker", path="/usr/bin:/bin"):
        assert "preflight failed on node 10.0.0.9: docker: docker engine does not answer" in result.stderr
    else:
        assert "preflight failed on node 10.0.0.9: docker: docker CLI not found" in result.stderr
    assert "compute-interface: ok (lo up)" in result.stdout
    assert result.returncode == 1


# The compute address must sit on the compute interface: NCCL's rendezvous and the KV handshakes
# dial it, whatever NCCL_SOCKET_IFNAME says.

ADDRESSES = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: bond0    inet {bond0}/24 brd 174.1.60.255 scope global bond0\\       valid_lft forever
3: bond1    inet {bond1}/24 brd 10.0.0.255 scope global bond1\\       valid_lft forever
"""


def fake_ip(directory: Path, *, bond0: str, bond1: str) -> Path:
    (fake_tool(directory, "ip", """case "$*" in
  "-o link show dev bond1") echo "3: bond1: <BROADCAST,MULTICAST,MASTER,UP,LOWER_UP> mtu 9000" ;;
  "-o -4 addr show") cat "$(dirname "$0")/addresses" ;;
  *) exit 1 ;;
esac
""") / "addresses").write_text(ADDRESSES.format(bond0=bond0, bond1=bond1))
    return directory


def test_preflight_address_on_the_compute_interface_passes(tmp_path: Path) -> None:
    tools = fake_ip(tmp_path / "bin", bond0="174.1.61.3", bond1="174.1.60.3")
    result = preflight("--node", "174.1.60.3", "--compute-interface", "bond1", tools=tools)
    assert "preflight 174.1.60.3: address: ok (174.1.60.3 on bond1)" in result.stdout
    assert "address:" not in result.stderr


def test_preflight_address_on_the_management_interface_fails(tmp_path: Path) -> None:
    tools = fake_ip(tmp_path / "bin", bond0="174.1.60.3", bond1="10.0.0.3")
    result = preflight("--node", "174.1.60.3", "--compute-interface", "bond1", tools=tools)
    assert result.returncode == 1
    assert ("preflight failed on node 174.1.60.3: address: 174.1.60.3 is on bond0, not on bond1 "
            "(bond1 has 10.0.0.3/24); the other ranks, the router and the KV handshakes dial "
            "174.1.60.3, so they would not use bond1: assign 174.1.60.3 to bond1, or set this "
            "node's address in `nodes` to its bond1 address") in result.stderr


def test_preflight_address_on_no_interface_fails() -> None:
    # The real `ip` on this machine: 10.0.0.9 is not one of its addresses, lo holds 127.0.0.1.
    result = preflight("--node", "10.0.0.9", "--compute-interface", "lo")
    assert ("preflight failed on node 10.0.0.9: address: 10.0.0.9 is on no interface of this "
            "node (lo has 127.0.0.1/8)") in result.stderr
    assert "preflight 127.0.0.1: address: ok (127.0.0.1 on lo)" in preflight(
        "--node", "127.0.0.1", "--compute-interface", "lo").stdout


# RDMA ports must be ACTIVE and the devices the containers map must exist.


def fake_sysfs(root: Path, states: dict[str, list[str]]) -> Path:
    """/sys/class/infiniband/DEV/ports/N/state with the given states (port numbers from 1)."""
    for device, device_states in states.items():
        (root / "class" / "infiniband" / device / "ports").mkdir(parents=True)
        for number, state in enumerate(device_states, start=1):
            port = root / "class" / "infiniband" / device / "ports" / str(number)
            port.mkdir()
            (port / "state").write_text(state + "\n")
    return root


def test_preflight_rdma_ports_active_pass(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, {"mlx5_0": ["4: ACTIVE"], "mlx5_1": ["4: ACTIVE", "4: ACTIVE"]})
    result = preflight("--rdma-devices", "mlx5_0,mlx5_1", "--sysfs-root", str(sysfs))
    assert "preflight 10.0.0.9: rdma: ok (mlx5_0,mlx5_1 ACTIVE)" in result.stdout
    assert "rdma:" not in result.stderr


def test_preflight_rdma_port_not_active_fails(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, {"mlx5_0": ["4: ACTIVE"], "mlx5_1": ["1: DOWN"],
                                  "mlx5_2": ["4: ACTIVE", "2: INIT"], "mlx5_3": []})
    result = preflight("--rdma-devices", "mlx5_0,mlx5_1,mlx5_2,mlx5_3", "--sysfs-root", str(sysfs))
    assert result.returncode == 1
    assert ("preflight failed on node 10.0.0.9: rdma: mlx5_1 port 1 is DOWN, mlx5_2 port 2 is "
            "INIT, mlx5_3 has no ports (not ACTIVE); bring the link up (ibstat, cable, switch "
            "port) or remove the device from network.rdmaDevices") in result.stderr


def test_preflight_container_device_paths(tmp_path: Path) -> None:
    (tmp_path / "infiniband").mkdir()
    present = str(tmp_path / "infiniband")
    result = preflight("--device-paths", present)
    assert f"preflight 10.0.0.9: devices: ok ({present})" in result.stdout
    result = preflight("--device-paths", f"{present},/dev/kimipd-no-such-device")
    assert ("preflight failed on node 10.0.0.9: devices: /dev/kimipd-no-such-device not found "
            "(container.devices; docker would refuse to start the ranks); load the RDMA drivers "
            "(mlx5_ib, rdma-core) or remove it from container.devices") in result.stderr


# The model: a missing one costs a whole attempt (the ranks die after the pull and the wait).


def test_preflight_model_with_config_json_passes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = preflight("--model-host-path", str(tmp_path))
    assert f"preflight 10.0.0.9: model: ok ({tmp_path}/config.json)" in result.stdout


def test_preflight_model_without_config_json_fails(tmp_path: Path) -> None:
    result = preflight("--model-host-path", str(tmp_path))
    assert result.returncode == 1
    assert (f"preflight failed on node 10.0.0.9: model: no config.json in {tmp_path} (the node "
            "side of model.path): the copy is incomplete or model.path names the wrong "
            "directory; copy the whole model, or fix model.path") in result.stderr
    result = preflight("--model-host-path", str(tmp_path / "Kimi-K3"))
    assert (f"preflight failed on node 10.0.0.9: model: {tmp_path}/Kimi-K3 not found (the node "
            "side of model.path through container.volumes); copy the model there, or fix "
            "model.path or the volume") in result.stderr


# Ports: free, or held by this stack's own (host-network) containers.


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port this test process listens on (a foreign process, as far as preflight can tell)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_preflight_free_ports_pass() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = preflight("--ports", f"{port}=router.port")
    assert (f"preflight 10.0.0.9: ports: ok (free: {port}; held by this stack's containers: "
            "none)") in result.stdout


def test_preflight_port_held_by_a_foreign_process_fails(held_port: int) -> None:
    result = preflight("--ports", f"{held_port}=groups.prefill.distInitPort+3")
    assert result.returncode == 1
    line = next(line for line in result.stderr.splitlines() if ": ports: " in line)
    # ss names the owner (this test's python) with its pid.
    assert line.startswith(f"preflight failed on node 10.0.0.9: ports: port {held_port} "
                           "(groups.prefill.distInitPort+3) is held by python"), line
    assert line.endswith(f" pid {os.getpid()}, not by a kimipd-* container; stop that process, "
                         "or set groups.prefill.distInitPort to a free port"), line


def fake_docker_ps(directory: Path, pid: int) -> Path:
    """A docker whose one running kimipd-* container has main process PID."""
    return fake_tool(directory, "docker", f"""case "$1" in
  ps) echo 0123456789ab ;;
  inspect) echo "{pid} /kimipd-prefill-r0" ;;
esac
""")


def test_preflight_port_held_by_our_container_passes(tmp_path: Path) -> None:
    # ss names no owner (not root): a running kimipd-* container is taken to hold it.
    tools = fake_tool(tmp_path, "ss", """echo "LISTEN 0 128 0.0.0.0:30000 0.0.0.0:*"\n""")
    result = preflight("--ports", "30000=groups.prefill.httpPort,8998=groups.prefill.bootstrapPort",
                       tools=fake_docker_ps(tools, os.getpid()))
    assert ("preflight 10.0.0.9: ports: ok (free: 8998; held by this stack's containers: "
            "30000:kimipd-prefill-r0)") in result.stdout
    assert "ports:" not in result.stderr


def test_preflight_port_held_outside_our_containers_fails_even_while_they_run(
        tmp_path: Path, held_port: int) -> None:
    # The owner ss names shares no pid namespace with kimipd-prefill-r0 (it is in the node's own).
    result = preflight("--ports", f"{held_port}=router.port",
                       tools=fake_docker_ps(tmp_path, os.getpid()))
    assert f"ports: port {held_port} (router.port) is held by python" in result.stderr


# -- readiness gate -----------------------------------------------------------------------------


@pytest.fixture
def health_server() -> Iterator[tuple[str, list[int]]]:
    """A loopback server answering /health with the codes in `codes` (the last one repeats)."""
    codes = [503]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            code = codes.pop(0) if len(codes) > 1 else codes[0]
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake_servers.serve(server)
    yield f"http://127.0.0.1:{server.server_address[1]}/health", codes
    fake_servers.stop(server)


def fake_docker(tmp_path: Path, state: str) -> dict:
    """A `docker` on PATH that reports STATE for inspect and prints a log for logs."""
    tool = tmp_path / "docker"
    tool.write_text(f"""#!/bin/sh
case "$1" in
  inspect) echo "{state}" ;;
  logs) echo "loading weights"; echo "RuntimeError: CUDA out of memory" ;;
esac
""")
    tool.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_gate_passes_once_healthy(health_server, tmp_path: Path) -> None:
    url, codes = health_server
    codes[:] = [503, 503, 200]
    result = bash("wait-healthy.sh", "--url", url, "--container", "kimipd-decode-r0",
                  "--timeout", "30", "--interval", "1", env=fake_docker(tmp_path, "running (exit code 0)"))
    assert result.returncode == 0, result.stderr
    assert "waiting for" in result.stdout and "kimipd-decode-r0: healthy after" in result.stdout


def test_a_groups_gate_prints_the_fingerprint_of_the_checkpoint_it_loaded(
        health_server, tmp_path: Path) -> None:
    """Config and index contents and every file's size: the same checkpoint copied to another
    node gives the same fingerprint (no times, no paths); one rewritten in place another."""
    from components.render import model_fingerprint

    url, codes = health_server

    def fingerprint(model: Path) -> str | None:
        codes[:] = [200]
        result = bash("wait-healthy.sh", "--url", url, "--container", "kimipd-decode-r0",
                      "--timeout", "30", "--interval", "1", "--fingerprint", str(model),
                      env=fake_docker(tmp_path, "running (exit code 0)"))
        assert result.returncode == 0, result.stderr
        return model_fingerprint(result.stdout)

    def checkpoint(where: Path, shard: bytes, config: str = '{"num_layers": 61}') -> Path:
        where.mkdir(parents=True)
        (where / "config.json").write_text(config)
        (where / "model.safetensors.index.json").write_text('{"weight_map": {"w": "s-1"}}')
        (where / "model-00001.safetensors").write_bytes(shard)
        return where

    first = fingerprint(checkpoint(tmp_path / "node-1" / "Kimi-K3", b"\0" * 64))
    assert first is not None and len(first) == 12
    assert fingerprint(checkpoint(tmp_path / "node-2" / "Kimi-K3", b"\1" * 64)) == first
    assert fingerprint(checkpoint(tmp_path / "resized", b"\0" * 65)) != first
    assert fingerprint(checkpoint(tmp_path / "reconfigured", b"\0" * 64,
                                  '{"num_layers": 62}')) != first
    # No such directory on the node: said, and no fingerprint in the contract.
    assert fingerprint(tmp_path / "missing") is None


def test_gate_reports_a_changed_answer_not_every_poll(health_server, tmp_path: Path) -> None:
    url, codes = health_server
    codes[:] = [503] * 12 + [404] * 3 + [200]
    result = bash("wait-healthy.sh", "--url", url, "--container", "kimipd-decode-r0",
                  "--timeout", "30", "--interval", "0.1", env=fake_docker(tmp_path, "running (exit code 0)"))
    assert result.returncode == 0, result.stderr
    waiting = [line for line in result.stdout.splitlines() if "waiting for" in line]
    assert [line.split("HTTP ")[1].split(",")[0] for line in waiting] == ["503", "404"], result.stdout


def test_gate_fails_fast_with_the_log_tail_when_the_container_exits(health_server, tmp_path: Path) -> None:
    url, _ = health_server
    result = bash("wait-healthy.sh", "--url", url, "--container", "kimipd-prefill-r2",
                  "--node", "174.1.60.3", "--timeout", "30", "--interval", "1",
                  env=fake_docker(tmp_path, "exited (exit code 1)"))
    assert result.returncode == 1
    assert "kimipd-prefill-r2 on 174.1.60.3: not running: exited (exit code 1)" in result.stderr
    assert "last 100 lines of kimipd-prefill-r2 on 174.1.60.3:" in result.stderr
    assert "  | RuntimeError: CUDA out of memory" in result.stderr


def test_gate_times_out(health_server, tmp_path: Path) -> None:
    url, _ = health_server
    result = bash("wait-healthy.sh", "--url", url, "--container", "kimipd-decode-r0",
                  "--timeout", "2", "--interval", "1", env=fake_docker(tmp_path, "running (exit code 0)"))
    assert result.returncode == 1
    assert "kimipd-decode-r0 on this node: not healthy after" in result.stderr and "answered 503" in result.stderr


# -- container entry point ----------------------------------------------------------------------


def make_wheel(directory: Path, name: str, version: str) -> Path:
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{name}/__init__.py", f"VERSION = {version!r}\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def test_launch_installs_wheels_applies_patches_then_execs(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "mooncake_transfer_engine_test", "0.3.12.post1")
    marker = tmp_path / "patched"
    patch = tmp_path / "patch_k3.py"
    patch.write_text(f"open({str(marker)!r}, 'w').write('sm_120')\n")
    target = tmp_path / "site"
    python_dir = Path(sys.executable).parent
    result = bash("launch.sh", "--wheel", str(wheel), "--patch", str(patch), "--",
                  "python3", "-c", "import mooncake_transfer_engine_test as m; print('running', m.VERSION)",
                  env={"PATH": f"{python_dir}:/usr/bin:/bin", "PIP_TARGET": str(target),
                       "PYTHONPATH": str(target), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "sm_120"
    assert result.stdout.splitlines()[-1] == "running 0.3.12.post1"


def test_launch_refuses_an_image_without_a_required_module_and_says_why() -> None:
    """The rust router's release (smg) is proven where the node files are installed: a prepared
    image without it fails to build, before any container changes."""
    missing = bash("launch.sh", "--require-module", "kimipd_no_such_module",
                   "router.kind rust runs: add its wheel to nodeFiles", "--", "true")
    assert missing.returncode == 1
    assert ("Python cannot import kimipd_no_such_module, which router.kind rust runs: add its "
            "wheel to nodeFiles") in missing.stderr
    present = bash("launch.sh", "--require-module", "json", "any", "--", "true")
    assert present.returncode == 0, present.stderr


def test_launch_refuses_an_unknown_option() -> None:
    result = bash("launch.sh", "--wheels", "x.whl", "--", "true")
    assert result.returncode == 2 and "unknown option '--wheels'" in result.stderr


def test_busy_gpus_fail_preflight_unless_this_stacks_ranks_hold_them(tmp_path: Path) -> None:
    """Preflight re-runs when its script changes: on a serving node our own ranks hold the GPUs."""
    tools = fake_tool(tmp_path / "bin", "nvidia-smi", "for i in 1 2 3 4 5 6 7 8; do echo 70000; done\n")
    fake_tool(tools, "docker", "exit 0\n")  # no kimipd-* container running
    result = preflight("--gpus", "8", tools=tools)
    assert result.returncode == 1
    assert "gpus: 8 of 8 GPUs use more than 0 MiB (not idle)" in result.stderr
    fake_tool(tools, "docker", 'case "$1" in ps) echo abc123 ;; inspect) echo "1 /kimipd-decode-r0" ;; esac\n')
    result = preflight("--gpus", "8", "--node", "127.0.0.1", tools=tools)
    assert result.returncode == 0, result.stderr
    assert "gpus: ok (8 GPUs in use by this stack's kimipd-* containers)" in result.stdout


# -- prepare-image.sh -----------------------------------------------------------------------------


def _prepare_image(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """prepare-image.sh with a docker that knows no image and records what it is asked to build."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'
                      'case "$1" in image) exit 1 ;; build) exit 0 ;; esac\n')
    docker.chmod(0o755)
    return subprocess.run(["bash", str(REPO / "assets" / "prepare-image.sh"), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})


def test_prepare_image_refuses_a_node_file_that_differs_from_the_stacks_digest(
        tmp_path: Path) -> None:
    wheel = tmp_path / "flash_kda-0.0.1-py3-none-any.whl"
    wheel.write_bytes(b"rewritten on the node")
    result = _prepare_image(tmp_path, "--node", "174.1.60.3", "--base", "sha256:" + "b" * 64,
                            "--tag", "kimipd/prepared:abc", "--stack", "pro6000",
                            "--sha256", str(wheel), "0" * 64, "--", "--wheel", str(wheel),
                            "--require-mooncake", "0.3.12.post1")
    assert result.returncode == 1
    assert (f"prepared image on node 174.1.60.3: {wheel} has sha256 " in result.stderr
            and f"the stack copied {'0' * 64}" in result.stderr), result.stderr
    assert "build" not in (tmp_path / "bin" / "calls").read_text()


def test_prepare_image_builds_from_the_checked_copies_without_network(tmp_path: Path) -> None:
    wheel = tmp_path / "flash_kda-0.0.1-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    digest = hashlib.sha256(b"a wheel").hexdigest()
    result = _prepare_image(tmp_path, "--node", "174.1.60.3", "--base", "sha256:" + "b" * 64,
                            "--tag", "kimipd/prepared:abc", "--stack", "pro6000",
                            "--sha256", str(wheel), digest, "--", "--wheel", str(wheel),
                            "--require-mooncake", "0.3.12.post1")
    # The fake docker built nothing, so the final inspect fails; the build call is what counts.
    calls = (tmp_path / "bin" / "calls").read_text()
    assert "build --network none --tag kimipd/prepared:abc" in calls, result.stderr
    assert "building kimipd/prepared:abc on 174.1.60.3" in result.stderr
