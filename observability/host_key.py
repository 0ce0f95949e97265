"""The observability node's pinned host key, found as the serving project finds its nodes'."""

from __future__ import annotations

from pathlib import Path

from components.config import ConfigError
from components.host_keys import host_keys_in

from .config import CONFIG_NAMESPACE, ObservabilityConfig


def resolve_host_key(cfg: ObservabilityConfig) -> str | None:
    """node.hostKey, else the node's key in connection.knownHostsFile, else None (unpinned,
    only when neither is set). A known_hosts file without the node is refused."""
    node, path = cfg.node, cfg.connection.known_hosts_file
    if node.host_key is not None or path is None:
        return node.host_key
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"invalid {CONFIG_NAMESPACE} connection:\n  connection.knownHostsFile: "
                          f"{path!r} does not exist on this machine; create it (ssh-keyscan, then "
                          "check the fingerprint) or fix the path.")
    keys = host_keys_in(file.read_text(), node.address, node.ssh_port)
    if not keys:
        raise ConfigError(
            f"invalid {CONFIG_NAMESPACE} host keys:\n  node: {node.address!r} has no key in "
            f"connection.knownHostsFile {path!r}; without one the node is not authenticated: add "
            f"it (`ssh-keyscan -t ed25519 {node.address}`, then compare the fingerprint) or set "
            "node.hostKey.")
    return keys[0]
