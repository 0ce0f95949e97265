"""Host keys from a known_hosts file: plain, hashed and port entries; missing ones refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest

from components.config import ConfigError, load_cluster_config
from components.host_keys import host_keys_in, resolve_host_keys
from components.render import docker_ssh_opts

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJfgKiWamXPTsd7uZhA6AgAZzUZsY6dG8SGay1UGWS5Q"
RSA = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_plain_entry_with_ed25519_preferred() -> None:
    text = f"174.1.60.1 {RSA}\n174.1.60.1,node1 {ED25519}\n174.1.60.2 {RSA}\n"
    assert host_keys_in(text, "174.1.60.1") == [ED25519, RSA]


def test_hashed_entry() -> None:
    text = f"{hashed('174.1.60.3')} {ED25519}\n{hashed('174.1.60.4')} {RSA}\n"
    assert host_keys_in(text, "174.1.60.3") == [ED25519]


def test_non_default_port_uses_bracket_form() -> None:
    text = f"[174.1.60.5]:2222 {ED25519}\n174.1.60.5 {RSA}\n"
    assert host_keys_in(text, "174.1.60.5", 2222) == [ED25519]
    assert host_keys_in(text, "174.1.60.5") == [RSA]


def test_revoked_and_comment_lines_are_ignored() -> None:
    text = f"# 174.1.60.6 {ED25519}\n@revoked 174.1.60.6 {ED25519}\n"
    assert host_keys_in(text, "174.1.60.6") == []


def known_hosts_config(pro6000: dict, tmp_path: Path, lines: list[str]):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("\n".join(lines) + "\n")
    pro6000["connection"]["knownHostsFile"] = str(known_hosts)
    return load_cluster_config(pro6000)


def test_every_node_resolved_and_explicit_key_wins(pro6000: dict, tmp_path: Path) -> None:
    pro6000["nodes"][7]["hostKey"] = RSA
    config = known_hosts_config(pro6000, tmp_path, [f"174.1.60.{i} {ED25519}" for i in range(1, 9)])
    keys = resolve_host_keys(config)
    assert keys["174.1.60.1"] == ED25519 and keys["174.1.60.8"] == RSA


def test_node_missing_from_known_hosts_is_refused(pro6000: dict, tmp_path: Path) -> None:
    config = known_hosts_config(pro6000, tmp_path, [f"174.1.60.{i} {ED25519}" for i in range(1, 8)])
    with pytest.raises(ConfigError) as error:
        resolve_host_keys(config)
    assert "nodes[7]: '174.1.60.8' has no key in connection.knownHostsFile" in str(error.value)
    assert "ssh-keyscan -t ed25519 174.1.60.8" in str(error.value)


def test_missing_known_hosts_file_is_refused(pro6000: dict, tmp_path: Path) -> None:
    pro6000["connection"]["knownHostsFile"] = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match="connection.knownHostsFile: .* does not exist"):
        resolve_host_keys(load_cluster_config(pro6000))


def test_without_a_file_only_explicit_keys_are_pinned(pro6000: dict) -> None:
    del pro6000["connection"]["knownHostsFile"]
    pro6000["nodes"][0]["hostKey"] = ED25519
    keys = resolve_host_keys(load_cluster_config(pro6000))
    assert keys["174.1.60.1"] == ED25519 and keys["174.1.60.2"] is None


def test_docker_ssh_opts_pin_the_same_file(pro6000: dict) -> None:
    assert docker_ssh_opts(load_cluster_config(pro6000)) == [
        "-o", "UserKnownHostsFile=~/.ssh/known_hosts", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes"]
