"""The scripts that run on nodes and in containers, run here for real (loopback only)."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

ASSETS = REPO / "assets"


def bash(script: str, *args: str, env: dict | None = None, timeout: int = 60,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ASSETS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, input=stdin, check=False)


def test_scripts_are_shellcheck_clean() -> None:
    assert shutil.which("shellcheck"), "shellcheck is missing: .ci/run installs it"
    scripts = [*ASSETS.glob("*.sh"), REPO / "sim" / "sim", REPO / ".ci" / "run",
               *(path for path in (REPO / "scripts").iterdir() if path.is_file())]
    result = subprocess.run(["shellcheck", *sorted(map(str, scripts))],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


# -- preflight ----------------------------------------------------------------------------------


def preflight(*overrides: str) -> subprocess.CompletedProcess:
    args = dict(zip(*[iter([
        "--node", "10.0.0.9", "--gpus", "0", "--max-gpu-memory-used-mib", "0",
        "--rdma-devices", "", "--compute-interface", "lo", "--nvidia-runtime", "no",
        "--disk-path", "/", "--min-free-disk-gb", "0", *overrides])] * 2))
    argv = [item for pair in args.items() for item in pair]
    # Fed on stdin, exactly as the Node component runs it.
    return subprocess.run(["bash", "-s", "--", *argv], input=(ASSETS / "preflight.sh").read_text(),
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent.sock"})


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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health", codes
    server.shutdown()
    server.server_close()


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


def test_launch_refuses_an_unknown_option() -> None:
    result = bash("launch.sh", "--wheels", "x.whl", "--", "true")
    assert result.returncode == 2 and "unknown option '--wheels'" in result.stderr
