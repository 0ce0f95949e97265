"""The door's virtual IP: keepalived beside the door on each of the two door nodes
(render/keepalived.py says how it is configured, docs/vrrp-trial.md why)."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from .config import ClusterConfig
from .containers import node_container
from .door import Door
from .gates import HealthGate
from .node import Node
from .render import (
    keepalived_config,
    keepalived_plan,
    remove_virtual_ip_files_command,
    virtual_ip_spec,
    write_keepalived_config_command,
)
from .render.keepalived import KEEPALIVED_STOP_GRACE_SECONDS


class VirtualIp(pulumi.ComponentResource):
    """keepalived and the door's check loop in one container on DOOR's node, after the node's
    firewall (which keeps strangers' VRRP out) and the door; removed before the door on destroy,
    so the address leaves with a priority-0 advert while the door still serves.

    Its configuration is a file keepalived reloads (SIGHUP): a change of it (interval, interface,
    priority) is an in-place update; only a new image replaces the container."""

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node], door: Door,
                 after: VirtualIp | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = keepalived_plan(cfg, door.address)
        super().__init__("kimipd:virtual_ip:VirtualIp", plan.role, None, opts)
        node = nodes[door.address]
        self.image = docker.RemoteImage(
            f"{plan.role}-image", name=virtual_ip_spec(cfg).image, keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=node.provider,
                                        depends_on=node.ready))
        self.config = command.remote.Command(
            f"{plan.role}-config",
            connection=node.connection,
            create=write_keepalived_config_command(cfg),
            update=write_keepalived_config_command(cfg),
            delete=remove_virtual_ip_files_command(cfg),
            stdin=keepalived_config(cfg, door.address),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.image]))
        # AFTER: the other node's keepalived, whose new container holds or backs the address
        # before this one goes: replacing both at once would leave the address on no node.
        self.container = node_container(plan, node, depends_on=[
                                            self.config, door.container,
                                            *([after.gate] if after is not None else [])],
                                        parent=self, image=self.image.image_id,
                                        stop_grace_seconds=KEEPALIVED_STOP_GRACE_SECONDS)
        # Passes once some door node holds the address and its door answers through it.
        self.gate = HealthGate(f"{plan.role}-ready", cfg, nodes, [plan], [self.container],
                               opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
