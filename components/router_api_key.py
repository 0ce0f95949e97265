"""The rust router's API key on a router node."""

from __future__ import annotations

import pulumi
import pulumi_command as command

from .aliases import old_router_urn
from .config import ClusterConfig
from .node import Node
from .render import (
    router_api_key_file,
    router_auth_header_file,
    write_api_key_command,
)


class RouterApiKey(pulumi.ComponentResource):
    """The rust router's key on a router node, in a file only root reads (every slot on the node
    reads it, and the scripts that talk to the slots on router.node)."""

    def __init__(self, cfg: ClusterConfig, node: Node, api_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        # router.node's keeps its names; the other door node's (slot b's) names the node.
        suffix = "" if node.address == cfg.router.node else "-" + node.address.replace(".", "-")
        super().__init__("kimipd:router:RouterApiKey", f"router-key{suffix}", None, opts)
        # The secret reaches the node on stdin. A new key is a new file resource, whose id each
        # router carries as a label: the routers restart with it, and every group is admitted
        # again.
        self.file = command.remote.Command(
            f"router-api-key{suffix}",
            connection=node.connection,
            create=write_api_key_command(cfg),
            delete=f"rm -f {router_api_key_file(cfg)} {router_auth_header_file(cfg)}",
            stdin=api_key,
            triggers=[api_key],
            opts=pulumi.ResourceOptions(parent=self, depends_on=node.ready,
                                        delete_before_replace=True,
                                        # It was the (one) router's own child.
                                        aliases=[pulumi.Alias(parent=old_router_urn())]
                                        if not suffix else None))
        self.register_outputs({})
