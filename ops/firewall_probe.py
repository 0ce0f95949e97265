"""Whether the program's nftables table is on a node: `pulumi refresh` cannot tell (a command
resource has no read, so a flushed ruleset goes unseen until someone looks)."""

from __future__ import annotations

from .remote import RemoteError, Transport, run_patiently


def firewall_on_node(transport: Transport, node: str, table: str, timeout: float) -> str:
    """present, missing, or unknown and why: the program's TABLE on NODE."""
    try:
        result = run_patiently(transport, node, f"nft list table {table} >/dev/null", timeout)
    except RemoteError as error:
        return f"unknown: {error}"
    if result.status == 0:
        return "present"
    if "No such file or directory" in result.err or result.status == 1:
        return "missing"
    return f"unknown: {result.err.strip()[:160]}"

