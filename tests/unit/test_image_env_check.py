"""assets/image-env-check.sh against an image environment served by a stand-in `docker` CLI."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from components.config import load_cluster_config
from components.render import image_env_check_command, variables_set_in_every_container
from tests.conftest import REPO

SCRIPT = (REPO / "assets" / "image-env-check.sh").read_text()


def run_check(tmp_path: Path, pro6000: dict, image_env: list[str]) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    lines = "".join(f"{line}\n" for line in image_env)
    docker.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'image inspect' ] || exit 9\nprintf %s {shlex.quote(lines)}\n")
    docker.chmod(0o755)
    command = image_env_check_command(load_cluster_config(pro6000), "174.1.60.3",
                                      "sha256:abc", SCRIPT)
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, check=False)


def test_a_clean_image_passes(tmp_path: Path, pro6000: dict) -> None:
    result = run_check(tmp_path, pro6000, ["PATH=/usr/bin", "NCCL_DEBUG=INFO"])
    assert result.returncode == 0, result.stderr
    assert "image sha256:abc on node 174.1.60.3: environment ok" in result.stdout


@pytest.mark.parametrize("variable", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_expandable_segments_baked_into_the_image_is_refused(tmp_path, pro6000, variable) -> None:
    result = run_check(tmp_path, pro6000, [f"{variable}=garbage_collection_threshold:0.6,"
                                           "expandable_segments:True"])
    assert result.returncode == 1
    assert (f"image sha256:abc on node 174.1.60.3: its environment sets {variable}=" in result.stderr
            and "runbook rule 1" in result.stderr and f"set container.env.{variable}" in result.stderr)


def test_a_value_the_stack_overrides_is_not_refused(tmp_path, pro6000) -> None:
    pro6000["container"]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    assert "PYTORCH_CUDA_ALLOC_CONF" in variables_set_in_every_container(load_cluster_config(pro6000))
    result = run_check(tmp_path, pro6000, ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"])
    assert result.returncode == 0, result.stderr


def test_nccl_settings_of_the_image_are_overridden_by_the_program(pro6000) -> None:
    """The program always sets both interfaces, so an image's NCCL_SOCKET_IFNAME never applies."""
    overridden = variables_set_in_every_container(load_cluster_config(pro6000))
    assert {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"} <= set(overridden)


@pytest.mark.parametrize("value", ["bond0", "^docker0,lo", "bond1,bond0"])
def test_collectives_on_the_management_interface_are_refused(tmp_path: Path, value: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\necho 'NCCL_SOCKET_IFNAME={value}'\n")
    (bin_dir / "docker").chmod(0o755)
    result = subprocess.run(
        ["bash", str(REPO / "assets" / "image-env-check.sh"), "--node", "174.1.60.3", "--image",
         "img", "--management-interface", "bond0", "--overridden", ""],
        capture_output=True, text=True, timeout=30, env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        check=False)
    assert result.returncode == 1
    assert (f"sets NCCL_SOCKET_IFNAME={value}, which lets collective traffic onto the management "
            "interface bond0 (runbook rule 4)") in result.stderr
