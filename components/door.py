"""The door: HAProxy on a door node, owning router.port in front of the two router slots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from .aliases import single_router_container_alias
from .config import ClusterConfig
from .containers import node_container
from .gates import HealthGate
from .node import Node
from .render import (
    door_bridge_command,
    door_bridge_retire_command,
    door_clients_command,
    door_clients_map_text,
    door_haproxy_config,
    door_plan,
    door_spec,
    door_url,
    key_digest,
    remove_door_clients_command,
    remove_door_files_command,
    write_door_config_command,
    write_door_tls_command,
)


class Door(pulumi.ComponentResource):
    """HAProxy on a door node (router.node, and with router.door.nodes the other one too),
    owning router.port in front of the two router slots.

    Its configuration is a file the door reloads (master-worker: the listener stays open), so a
    change of it refuses no connection. A new door image replaces the container through the
    bridge, which holds the listening sockets meanwhile (door_bridge_command), so that refuses
    none either. AFTER: the door before this one (with two door nodes), whose new container
    serves before this door's changes start: a bad image stops at the first node. Every
    resource of router.node's door keeps the names it had with one door node; the other door
    node's are named by its role (door-A-B-C-D)."""

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node], address: str,
                 tls_key: pulumi.Input[str] | None, after: Door | None = None,
                 internal_key: pulumi.Input[str] | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = door_plan(cfg, address)
        role = plan.role
        super().__init__("kimipd:router:Door", role, None, opts)
        self.role, self.address = role, address
        node = nodes[address]
        spec = door_spec(cfg)
        child = pulumi.ResourceOptions(parent=self)
        self.image = docker.RemoteImage(
            f"{role}-image", name=spec.image, keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=node.provider,
                                        depends_on=node.ready))
        files: list[pulumi.Resource] = []
        if spec.tls is not None:
            if tls_key is None:
                raise ValueError("router.door.tls needs the secret doorTlsKey")
            # Certificate, then key: one PEM, as HAProxy's `crt` reads it.
            self.tls = self._file(node, f"{role}-tls", write_door_tls_command(cfg),
                                  pulumi.Output.secret(pulumi.Output.concat(
                                      spec.tls.certificate.strip(), "\n", tls_key)),
                                  depends_on=node.ready)
            files.append(self.tls)
        if spec.client_keys:
            if internal_key is None:
                raise ValueError("router.door.clientKeys needs the secret routerApiKey")
            # The clients' key digests and the internal key, in files of the door's and in the
            # running door (its runtime API): a client added or revoked reloads nothing.
            self.clients = self._file(
                node, f"{role}-clients", door_clients_command(cfg),
                pulumi.Output.secret(pulumi.Output.from_input(internal_key).apply(
                    lambda key: f"{key}\n{door_clients_map_text(cfg, key_digest(key))}")),
                depends_on=[self.image, *files], delete=remove_door_clients_command(cfg))
            files.append(self.clients)
        # Changed in place (update): the door reloads it, keeping its listener.
        self.config = self._file(node, f"{role}-config", write_door_config_command(cfg),
                                 door_haproxy_config(cfg), depends_on=[self.image, *files],
                                 delete=remove_door_files_command(cfg))
        # Replaced with the container (the same inputs: the image and the plan), before it: a
        # HAProxy of the new image takes the running door's listening sockets, serves while the
        # old door finishes its streams and the new one starts, and gives them to the new one.
        previous = [after.gate, after.retire] if after is not None else []
        self.bridge = command.remote.Command(
            f"{role}-bridge",
            connection=node.connection,
            create=self.image.image_id.apply(lambda image: door_bridge_command(cfg, image)),
            triggers=[self.image.image_id, repr(plan)],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.config, *previous]))
        # Removed with SIGUSR1 (door_plan): its open streams get as long as a slot's.
        # router.node's door holds router.port where the single router did: it is that
        # container's replacement, so the router goes before the door binds the port (a stack
        # moving to the door; docs/decisions.md).
        self.container = node_container(plan, node, depends_on=[self.config, self.bridge],
                                        parent=self,
                                        image=self.image.image_id,
                                        aliases=[single_router_container_alias()]
                                        if address == cfg.router.node else (),
                                        stop_grace_seconds=cfg.router.drain_timeout_seconds + 5)
        self.gate = HealthGate(f"{role}-ready", cfg, nodes, [plan], [self.container], opts=child)
        # The bridge's soft stop, once the new door has loaded (else the bridge goes on serving).
        self.retire = command.remote.Command(
            f"{role}-bridge-retire",
            connection=node.connection,
            create=door_bridge_retire_command(),
            triggers=[self.container.id, self.bridge.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.gate]))
        self.url = door_url(cfg)
        self.register_outputs({"url": self.url})

    def _file(self, node: Node, name: str, write: str, stdin: pulumi.Input[str],
              depends_on: pulumi.Input[Sequence[pulumi.Resource]],
              delete: str | None = None) -> command.remote.Command:
        """A file of the door's on NODE, written from STDIN by WRITE and changed in place (the
        same command updates it; the running door takes the change without a restart)."""
        return command.remote.Command(
            name, connection=node.connection, create=write, update=write, delete=delete,
            stdin=stdin, opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on))
