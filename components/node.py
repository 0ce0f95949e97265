"""One GPU host: its SSH connection, preflight, docker engine, image and prepared files."""

from __future__ import annotations

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from .assets import ASSETS_DIR, NodeAssets
from .config import ClusterConfig, ConnectionSpec, NodeSpec
from .firewall import NodeFirewall
from .render import (
    NODE_SCRIPTS,
    NODE_TYPE,
    docker_ssh_opts,
    image_env_check_command,
    preflight_command,
    prepare_image_command,
    prepared_image_id,
    prepared_image_tag,
)


def ssh_connection(cfg: ClusterConfig, node: NodeSpec, private_key: pulumi.Input[str] | None,
                   host_key: str | None) -> command.remote.ConnectionArgsDict:
    return connection_args(cfg.connection, node, private_key, host_key)


def connection_args(connection: ConnectionSpec, node: NodeSpec,
                    private_key: pulumi.Input[str] | None,
                    host_key: str | None) -> command.remote.ConnectionArgsDict:
    """The command provider's SSH connection to NODE (the observability project's node too)."""
    args: command.remote.ConnectionArgsDict = {
        "host": node.address,
        "port": node.ssh_port,
        "user": node.ssh_user,
        "dial_error_limit": connection.dial_error_limit,
        "per_dial_timeout": connection.per_dial_timeout_seconds,
    }
    # Unset: the provider uses SSH_AUTH_SOCK's agent (a key is a Pulumi secret), and checks no
    # host key.
    if private_key is not None:
        args["private_key"] = private_key
    if host_key is not None:
        args["host_key"] = host_key
    return args


class Node(pulumi.ComponentResource):
    """A GPU host made ready to run containers: checked, files in place, image pulled."""

    provider: docker.Provider
    image_id: pulumi.Output[str]
    image_digest: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, node: NodeSpec,
                 private_key: pulumi.Input[str] | None, host_key: str | None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        name = node.resource_name
        super().__init__(NODE_TYPE, name, None, opts)
        self.resource_name = name
        child = pulumi.ResourceOptions(parent=self)
        self.address = node.address
        self.connection = ssh_connection(cfg, node, private_key, host_key)

        prepared: list[pulumi.Resource] = []
        if cfg.preflight.enabled:
            self.preflight = command.remote.Command(
                f"{name}-preflight",
                connection=self.connection,
                create=preflight_command(cfg, node.address,
                                         (ASSETS_DIR / "preflight.sh").read_text()),
                opts=child,
            )
            prepared.append(self.preflight)
        after_preflight = pulumi.ResourceOptions(parent=self, depends_on=prepared)

        self.assets = NodeAssets(cfg, name, self.connection, wait_for=prepared, opts=child)
        self.provider = docker.Provider(
            f"{name}-docker",
            host=f"ssh://{node.ssh_user}@{node.address}:{node.ssh_port}",
            ssh_opts=docker_ssh_opts(cfg),
            opts=child,
        )
        self.image = docker.RemoteImage(
            f"{name}-image",
            name=cfg.image,
            # `pulumi destroy` must not delete a 100+ GB image that takes an hour to pull again.
            keep_locally=True,
            opts=pulumi.ResourceOptions.merge(
                after_preflight, pulumi.ResourceOptions(provider=self.provider)),
        )
        self.image_id = self.image.image_id
        self.image_digest = self.image.repo_digest
        script = (ASSETS_DIR / "image-env-check.sh").read_text()
        self.image_check = command.remote.Command(
            f"{name}-image-env",
            connection=self.connection,
            create=self.image_id.apply(
                lambda image_id: image_env_check_command(cfg, node.address, image_id, script)),
            triggers=[self.image_id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.image]),
        )
        # What a container on this node waits for, and the image it runs: no container starts
        # before its node's firewall is up (and on destroy the table goes after them).
        self.ready: list[pulumi.Resource] = [self.image, self.image_check, self.assets]
        if cfg.firewall.enabled:
            self.firewall = NodeFirewall(cfg, name, node.address, self.connection,
                                         wait_for=prepared, opts=child)
            self.ready.append(self.firewall.rules)
        self.run_image_id = self.image_id
        self.prepared_image_tag: pulumi.Output[str] | None = None
        self.register_outputs({"imageId": self.image_id, "imageDigest": self.image_digest})

    def prepare_image(self, cfg: ClusterConfig, file_digests: dict[str, str]) -> None:
        """The base image with the node files installed, built on the node once per change of
        its inputs (the tag is their digest); kept on destroy like the base image."""
        scripts = {script: (ASSETS_DIR / script).read_text() for script in NODE_SCRIPTS}
        stack = pulumi.get_stack()
        self.prepared_image_tag = self.image_id.apply(
            lambda image_id: prepared_image_tag(cfg, image_id, file_digests, scripts))
        self.prepared_image = command.remote.Command(
            f"{self.resource_name}-prepared-image",
            connection=self.connection,
            create=pulumi.Output.all(self.image_id, self.prepared_image_tag).apply(
                lambda args: prepare_image_command(cfg, self.address, args[0], args[1], stack,
                                                   file_digests)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.ready)),
        )
        self.run_image_id = self.prepared_image.stdout.apply(prepared_image_id)
        self.ready.append(self.prepared_image)
