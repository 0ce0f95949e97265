"""launch.sh proves which Mooncake Python imports (runbook rule 3), in a real venv with real pip.

The venv plays the image: Mooncake 0.3.11.post1 installed as `mooncake-transfer-engine`, as
lmsysorg/sglang:kimi-k3 ships it; the node file is another distribution of the same package.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

LAUNCH = REPO / "assets" / "launch.sh"
MASTER = "#!/bin/sh\necho \"master pid $$ args $*\"\n"


def mooncake_wheel(directory: Path, distribution: str, version: str) -> Path:
    """A wheel of the `mooncake` package, with a `mooncake_master` "binary" inside it."""
    name = distribution.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    files = {
        "mooncake/__init__.py": f"RELEASE = {version!r}  # {distribution}\n".encode(),
        "mooncake/mooncake_master": MASTER.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            info_entry = zipfile.ZipInfo(path)
            info_entry.external_attr = 0o755 << 16 if path.endswith("mooncake_master") else 0o644 << 16
            archive.writestr(info_entry, data)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("wheels")
    return {
        "image": mooncake_wheel(directory, "mooncake-transfer-engine", "0.3.11.post1"),
        "node": mooncake_wheel(directory, "mooncake-transfer-engine-cuda13", "0.3.12.post1"),
        "old-node": mooncake_wheel(directory, "mooncake-transfer-engine-cuda13", "0.3.11"),
    }


@pytest.fixture
def image(tmp_path: Path, wheels: dict[str, Path]) -> dict[str, str]:
    """A fresh venv holding the image's Mooncake; returns the environment launch.sh runs in."""
    venv = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--no-deps",
                    str(wheels["image"])], check=True, timeout=120)
    return {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "HOME": str(tmp_path)}


def launch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LAUNCH), *args], capture_output=True, text=True,
                          env=env, timeout=180, check=False)


def distributions(env: dict[str, str]) -> str:
    return subprocess.run(["python3", "-m", "pip", "list", "--format=freeze"], env=env,
                          capture_output=True, text=True, check=True).stdout


def test_the_node_wheel_replaces_the_images_mooncake(image, wheels) -> None:
    result = launch(image, "--mooncake-wheel", str(wheels["node"]),
                    "--require-mooncake", "0.3.12.post1", "--",
                    "python3", "-c", "import mooncake; print('imports', mooncake.RELEASE)")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "uninstalling mooncake-transfer-engine (the image's Mooncake)" in result.stdout
    assert ("Mooncake 0.3.12.post1 (mooncake-transfer-engine-cuda13) at" in result.stdout
            and "ok (>= 0.3.12.post1)" in result.stdout)
    assert result.stdout.splitlines()[-1] == "imports 0.3.12.post1"
    installed = distributions(image)
    assert "mooncake-transfer-engine-cuda13==0.3.12.post1" in installed
    assert "mooncake-transfer-engine==" not in installed


def test_the_images_old_mooncake_is_refused_without_the_wheel(image) -> None:
    result = launch(image, "--require-mooncake", "0.3.12.post1", "--", "echo", "started")
    assert result.returncode == 1
    assert "started" not in result.stdout
    assert ("Python imports Mooncake 0.3.11.post1 (mooncake-transfer-engine," in result.stderr
            and "runbook rule 3: Mooncake >= 0.3.12.post1" in result.stderr)


def test_an_old_node_wheel_is_refused(image, wheels) -> None:
    result = launch(image, "--mooncake-wheel", str(wheels["old-node"]),
                    "--require-mooncake", "0.3.12.post1", "--", "echo", "started")
    assert result.returncode == 1 and "started" not in result.stdout
    assert "Python imports Mooncake 0.3.11 (mooncake-transfer-engine-cuda13" in result.stderr


def test_a_shadowing_second_distribution_is_refused(image, wheels) -> None:
    """What `pip install --force-reinstall` alone leaves behind: two owners of `mooncake/`."""
    subprocess.run(["python3", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--force-reinstall", str(wheels["node"])], env=image, check=True)
    result = launch(image, "--require-mooncake", "0.3.12.post1", "--", "echo", "started")
    assert result.returncode == 1 and "started" not in result.stdout
    assert "2 Mooncake distributions installed" in result.stderr
    assert "mooncake-transfer-engine 0.3.11.post1" in result.stderr


def test_the_master_binary_is_execed_directly(image, wheels) -> None:
    """The console script would run it as a child: docker's SIGTERM must reach the master."""
    result = launch(image, "--mooncake-wheel", str(wheels["node"]),
                    "--require-mooncake", "0.3.12.post1", "--",
                    "mooncake_master", "--rpc_port", "50051")
    assert result.returncode == 0, result.stderr
    exec_line = next(line for line in result.stdout.splitlines()
                     if line.startswith("launch.sh: exec "))
    assert exec_line.endswith("/mooncake/mooncake_master --rpc_port 50051"), exec_line
    assert result.stdout.splitlines()[-1].endswith("args --rpc_port 50051")
    assert os.path.isabs(exec_line.split()[2])
