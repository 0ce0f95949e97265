"""The router's key on the nodes that run SGLang ranks: every server requires it."""

from __future__ import annotations

import pulumi
import pulumi_command as command

from .config import ClusterConfig
from .node import Node
from .render import remove_worker_key_command, worker_key_yaml, write_worker_key_command


class WorkerKeyFile(pulumi.ComponentResource):
    """SGLang's --config file with `api-key` (and `admin-api-key`) on one node, written from
    stdin (a secret) and readable by root only. A new key is a new resource, whose id the
    node's ranks carry as a label: they restart with it (SGLang reads its key once, at start)."""

    def __init__(self, cfg: ClusterConfig, node: Node, api_key: pulumi.Input[str],
                 admin_key: pulumi.Input[str] | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:keys:WorkerKeyFile", f"{node.resource_name}-worker-key", None,
                         opts)
        content = pulumi.Output.secret(pulumi.Output.all(api_key, admin_key).apply(
            lambda keys: worker_key_yaml(keys[0], keys[1])))
        self.file = command.remote.Command(
            f"{node.resource_name}-sglang-api-key",
            connection=node.connection,
            create=write_worker_key_command(cfg),
            delete=remove_worker_key_command(cfg),
            stdin=content,
            triggers=[content],
            opts=pulumi.ResourceOptions(parent=self, depends_on=node.ready,
                                        delete_before_replace=True))
        self.register_outputs({})
