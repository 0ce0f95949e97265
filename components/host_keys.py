"""Host keys the program pins, read from a known_hosts file on the machine running Pulumi.

The command provider takes one pinned key per node (`connection.hostKey`); the docker provider's
`ssh` reads the same file (`UserKnownHostsFile`, `StrictHostKeyChecking=yes`). One file, both
checks: an operator verifies each node's fingerprint once, as for any ssh client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

from .config import ClusterConfig, ConfigError

# Preferred when a host has several keys; the command provider asks for the pinned key's type.
KEY_TYPE_ORDER = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                  "ecdsa-sha2-nistp521", "rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


def _names(address: str, port: int) -> set[str]:
    return {address} if port == 22 else {f"[{address}]:{port}"}


def _matches(pattern: str, names: set[str]) -> bool:
    if pattern.startswith("|1|"):  # hashed entry: |1|base64(salt)|base64(HMAC-SHA1(salt, name))
        _, _, salt, digest = pattern.split("|")
        return any(hmac.compare_digest(
            hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest(),
            base64.b64decode(digest)) for name in names)
    return bool(set(pattern.split(",")) & names)


def host_keys_in(known_hosts: str, address: str, port: int = 22) -> list[str]:
    """`type base64` keys for the host, best type first (markers and revoked keys skipped)."""
    names, keys = _names(address, port), []
    for line in known_hosts.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith("#") or fields[0].startswith("@"):
            continue
        if _matches(fields[0], names):
            keys.append(f"{fields[1]} {fields[2]}")
    rank = {key_type: index for index, key_type in enumerate(KEY_TYPE_ORDER)}
    return sorted(keys, key=lambda key: rank.get(key.split()[0], len(rank)))


def resolve_host_keys(cfg: ClusterConfig) -> dict[str, str | None]:
    """Each node's pinned key: its own `hostKey`, else the known_hosts file's, else None.

    With `connection.knownHostsFile` set, a node without a key is refused before anything runs.
    """
    path = cfg.connection.known_hosts_file
    text = ""
    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(f"invalid kimipd connection:\n  connection.knownHostsFile: {path!r} "
                              "does not exist on this machine; create it (ssh-keyscan, then check "
                              "each fingerprint) or fix the path.")
        text = file.read_text()
    resolved, problems = {}, []
    for index, node in enumerate(cfg.nodes):
        if node.host_key is not None or path is None:
            resolved[node.address] = node.host_key
            continue
        keys = host_keys_in(text, node.address, node.ssh_port)
        if not keys:
            problems.append(
                f"nodes[{index}]: {node.address!r} has no key in connection.knownHostsFile "
                f"{path!r}; without one the node is not authenticated: add it (`ssh-keyscan -t "
                f"ed25519 {node.address}`, then compare the fingerprint) or set "
                f"nodes[{index}].hostKey.")
            continue
        resolved[node.address] = keys[0]
    if problems:
        raise ConfigError("invalid kimipd host keys:\n  " + "\n  ".join(problems))
    return resolved
