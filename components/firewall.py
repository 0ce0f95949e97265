"""Each node's firewall: the program's own nftables table (render/firewall.py says what it
accepts and why)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from .config import ClusterConfig
from .render import (
    NODE_FIREWALL_TYPE,
    firewall_apply_command,
    firewall_remove_command,
    firewall_resource_name,
    firewall_ruleset,
)


class NodeFirewall(pulumi.ComponentResource):
    """The table is the command's stdin, so `pulumi preview --diff` shows the rules it will
    apply; a change (a node joins, a client network) rewrites the table in place, in one nft
    transaction, and destroy deletes it. Nothing else on the node is touched."""

    def __init__(self, cfg: ClusterConfig, node_name: str, address: str,
                 connection: command.remote.ConnectionArgsDict,
                 wait_for: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(NODE_FIREWALL_TYPE, f"{node_name}-firewall", None, opts)
        apply = firewall_apply_command(cfg)
        self.rules = command.remote.Command(
            firewall_resource_name(address),
            connection=connection,
            create=apply,
            update=apply,
            delete=firewall_remove_command(cfg),
            stdin=firewall_ruleset(cfg, address),
            # Replaced (`pulumi up --replace`, what `kimipd status` prints for a lost table): the
            # old one's delete removes the table, so it must run before the new one applies it.
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(wait_for),
                                        delete_before_replace=True))
        self.register_outputs({})
