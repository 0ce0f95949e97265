"""The sim stack files' paths to the sim's key, known_hosts and node files follow KIMIPD_CACHE
(sim/cache.py), and the git filter of scripts/setup-stack-sim writes them back as committed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from sim.cache import CACHE_PART, DEFAULT_CACHE, cache_dir, config_paths, follow_cache
from tests.conftest import REPO, observability_stack_values, stack_values

OTHER = "/home/operator/kimipd-cache-2"
SIM_STACK_FILES = [REPO / "Pulumi.sim.yaml", REPO / "Pulumi.sim-2p2d.yaml",
                   REPO / "observability" / "Pulumi.sim.yaml"]


def sim_paths(value) -> list[str]:
    if isinstance(value, str):
        return [value] if "/sim/ssh/" in value or "/sim/node-files/" in value else []
    if isinstance(value, dict):
        value = list(value.values())
    return [path for item in value for path in sim_paths(item)] if isinstance(value, list) else []


def test_the_cache_in_use_as_a_stack_file_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KIMIPD_CACHE", raising=False)
    assert cache_dir() == DEFAULT_CACHE
    monkeypatch.setenv("KIMIPD_CACHE", "")
    assert cache_dir() == DEFAULT_CACHE
    monkeypatch.setenv("KIMIPD_CACHE", str(Path.home() / ".cache" / "kimipd") + "/")
    assert cache_dir() == DEFAULT_CACHE
    monkeypatch.setenv("KIMIPD_CACHE", OTHER + "/")
    assert cache_dir() == OTHER
    monkeypatch.setenv("KIMIPD_CACHE", "/home/operator/kimipd cache")
    with pytest.raises(ValueError, match="use a directory whose path has none"):
        cache_dir()


@pytest.mark.parametrize("path", SIM_STACK_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_sim_path_of_a_sim_stack_file_follows_the_cache(path: Path) -> None:
    values = yaml.safe_load(path.read_text())["config"]
    committed = sim_paths(follow_cache(values, DEFAULT_CACHE))
    # known_hosts and the key's IdentityFile, in each; the node files in the serving stacks'
    assert len(committed) >= 2 and all(p.count(DEFAULT_CACHE + "/sim/") == 1 for p in committed)
    other = sim_paths(follow_cache(values, OTHER))
    assert other == [p.replace(DEFAULT_CACHE, OTHER) for p in committed]
    assert follow_cache(follow_cache(values, OTHER), DEFAULT_CACHE) == follow_cache(values, DEFAULT_CACHE)


def test_the_tests_read_the_sim_stacks_under_the_runs_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMIPD_CACHE", OTHER)
    serving = stack_values("sim")
    assert serving["connection"]["knownHostsFile"] == f"{OTHER}/sim/ssh/known_hosts"
    assert f"IdentityFile={OTHER}/sim/ssh/id_ed25519" in serving["connection"]["dockerSshOpts"]
    assert all(f["source"].startswith(f"{OTHER}/sim/node-files/") for f in serving["nodeFiles"])
    observability = observability_stack_values("sim")
    assert observability["connection"]["knownHostsFile"] == f"{OTHER}/sim/ssh/known_hosts"
    assert f"IdentityFile={OTHER}/sim/ssh/id_ed25519" in observability["connection"]["dockerSshOpts"]


def committed_text(path: str) -> str:
    shown = subprocess.run(["git", "-C", str(REPO), "show", f"HEAD:{path}"],
                           capture_output=True, text=True, check=False)
    assert shown.returncode == 0, f"git show HEAD:{path}: {shown.stderr}"
    return shown.stdout


def git_clean(text: str) -> str:
    return subprocess.run([str(REPO / "scripts" / "setup-stack-sim"), "--git-clean"], input=text,
                          capture_output=True, text=True, check=True, timeout=30).stdout


def test_the_git_filter_writes_another_caches_paths_back_as_committed() -> None:
    text = (REPO / "Pulumi.sim.yaml").read_text()
    moved = CACHE_PART.sub(OTHER, text)
    assert moved.count(OTHER) == 5, moved  # known_hosts, IdentityFile, three node files
    cleaned = git_clean(moved)
    assert cleaned == git_clean(text)
    assert OTHER not in cleaned
    assert "    knownHostsFile: ~/.cache/kimipd/sim/ssh/known_hosts\n" in cleaned


@pytest.mark.parametrize("stack", ["sim", "sim-2p2d"])
def test_the_git_filter_writes_the_pinned_images_back_as_committed(stack: str) -> None:
    """setup-stack-sim pins the node image, the door's and keepalived's (sim-2p2d's door on two
    nodes) by digest; git sees them at :latest again, and the key and salt gone."""
    text = committed_text(f"Pulumi.{stack}.yaml")
    pinned = text
    for repository in ("sim-node", "sim-door", "sim-keepalived"):
        pinned = pinned.replace(f"/kimipd/{repository}:latest",
                                f"/kimipd/{repository}@sha256:" + "ab" * 32)
    assert pinned.count("@sha256:") == (3 if stack == "sim-2p2d" else 2)
    pinned = "encryptionsalt: v1:abc\n" + pinned.replace(
        "config:\n", "config:\n  kimipd:routerApiKey:\n    secure: v1:xyz\n", 1)
    assert git_clean(pinned) == git_clean(text) == text


def test_setup_stack_sim_sets_the_paths_that_name_another_cache() -> None:
    """`pulumi config --json` of stack sim -> the `pulumi config set --path` keys and values."""
    # The committed file: the working copy carries whichever cache setup-stack-sim last wrote
    # (the README-command tests run it for a cache of their own).
    document = yaml.safe_load(committed_text("Pulumi.sim.yaml"))["config"]
    listed = {key: {"value": json.dumps(value), "objectValue": value, "secret": False}
              if isinstance(value, (dict, list)) else {"value": str(value), "secret": False}
              for key, value in document.items()}
    listed["kimipd:sshPrivateKey"] = {"secret": True}
    assert config_paths(listed, cache=DEFAULT_CACHE) == []
    assert sorted(config_paths(listed, cache=OTHER)) == [
        ("connection.dockerSshOpts[1]", f"IdentityFile={OTHER}/sim/ssh/id_ed25519"),
        ("connection.knownHostsFile", f"{OTHER}/sim/ssh/known_hosts"),
        ("nodeFiles[0].source", f"{OTHER}/sim/node-files/patch_k3_sm120.py"),
        ("nodeFiles[1].source", f"{OTHER}/sim/node-files/flash_kda-0.0.1-py3-none-any.whl"),
        ("nodeFiles[2].source", f"{OTHER}/sim/node-files/mooncake_transfer_engine_non_cuda-"
                                "0.3.13.post1-cp311-cp311-manylinux_2_28_x86_64.whl"),
    ]
    moved = {key: {"value": json.dumps(v := follow_cache(entry["objectValue"], OTHER)),
                   "objectValue": v, "secret": False} if "objectValue" in entry else entry
             for key, entry in listed.items()}
    assert sorted(key for key, _ in config_paths(moved, cache=DEFAULT_CACHE)) == sorted(
        key for key, _ in config_paths(listed, cache=OTHER))
