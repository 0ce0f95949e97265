"""Prometheus and Alertmanager on one node, watching one serving stack."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from components.node import connection_args
from components.render import connection_ssh_opts

from .config import ObservabilityConfig
from .render import (
    RUN_AS,
    TARGETS_FILE,
    ContainerPlan,
    alertmanager_plan,
    alertmanager_url,
    alertmanager_yaml,
    digest,
    directories_command,
    node_paths,
    prometheus_plan,
    prometheus_url,
    prometheus_yaml,
    ready_command,
    rules_file,
    targets_json,
    write_file_command,
)
from .rules import RULES_FILE
from .serving import ServingStack

# The serving project's readiness gate, reused as is (fed on stdin).
WAIT_HEALTHY = Path(__file__).resolve().parent.parent / "assets" / "wait-healthy.sh"
ROLE_LABEL = "kimipd-observability.role"
CONFIG_LABEL = "kimipd-observability.config-digest"


class Monitoring(pulumi.ComponentResource):
    """Files on the node, then Alertmanager, then Prometheus, each gated on its /-/ready.

    The targets file is its own resource and no container's input: a change of the serving
    stack's targets re-writes that file only, and Prometheus re-reads it (file_sd). A change of
    the configuration or the rules replaces the container they configure (its data stays on the
    node)."""

    prometheus_url: pulumi.Output[str]
    alertmanager_url: pulumi.Output[str]

    def __init__(self, name: str, cfg: ObservabilityConfig, serving: ServingStack,
                 ttft: tuple[float, str], private_key: pulumi.Input[str] | None,
                 host_key: str | None, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:observability:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.connection = connection_args(cfg.connection, cfg.node, private_key, host_key)
        self.provider = docker.Provider(
            "observability-docker",
            host=f"ssh://{cfg.node.ssh_user}@{cfg.node.address}:{cfg.node.ssh_port}",
            ssh_opts=connection_ssh_opts(cfg.connection), opts=child)
        self.directories = command.remote.Command(
            "observability-directories", connection=self.connection,
            create=directories_command(cfg), opts=child)
        paths = node_paths(cfg)
        prometheus_config = prometheus_yaml(cfg, serving.name)
        rules = rules_file(cfg, *ttft)
        self.prometheus_config = self._file("prometheus-config",
                                            f"{paths['prometheus_etc']}/prometheus.yml",
                                            prometheus_config)
        self.rules = self._file("prometheus-rules", f"{paths['prometheus_etc']}/{RULES_FILE}",
                                rules)
        self.targets = self._file("prometheus-targets",
                                  f"{paths['prometheus_etc']}/{TARGETS_FILE}",
                                  targets_json(serving.targets))
        alertmanager_config = alertmanager_yaml(cfg)
        self.alertmanager_config = self._file(
            "alertmanager-config", f"{paths['alertmanager_etc']}/alertmanager.yml",
            alertmanager_config)

        self.alertmanager, self.alertmanager_ready = self._container(
            "alertmanager", cfg, alertmanager_plan(cfg), digest(alertmanager_config),
            depends_on=[self.alertmanager_config])
        self.prometheus, self.prometheus_ready = self._container(
            "prometheus", cfg, prometheus_plan(cfg), digest(prometheus_config, rules),
            depends_on=[self.prometheus_config, self.rules, self.targets,
                        self.alertmanager_ready])
        self.prometheus_url = pulumi.Output.from_input(prometheus_url(cfg))
        self.alertmanager_url = pulumi.Output.from_input(alertmanager_url(cfg))
        self.register_outputs({"prometheusUrl": self.prometheus_url,
                               "alertmanagerUrl": self.alertmanager_url})

    def _file(self, name: str, path: str, content: str) -> command.remote.Command:
        """CONTENT written to PATH on the node through the command's stdin (no argv, no temp
        file here); a new content runs the command again, which touches only this file."""
        return command.remote.Command(
            name, connection=self.connection, create=write_file_command(path), stdin=content,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.directories]))

    def _container(self, role: str, cfg: ObservabilityConfig, plan: ContainerPlan,
                   config_digest: str, depends_on: list[pulumi.Resource],
                   ) -> tuple[docker.Container, command.remote.Command]:
        image = docker.RemoteImage(
            f"{role}-image", name=plan.image, keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=self.provider))
        container = docker.Container(
            role, name=plan.name, image=image.image_id, entrypoints=plan.entrypoint,
            command=plan.command, user=RUN_AS, network_mode="host",
            # Unlike the serving containers (a lone restarted rank cannot rejoin its group),
            # monitoring should come back by itself after a crash or a reboot.
            restart="unless-stopped",
            labels=[docker.ContainerLabelArgs(label=ROLE_LABEL, value=role),
                    # Its files changed: replace it, so it reads them (the data stays).
                    docker.ContainerLabelArgs(label=CONFIG_LABEL, value=config_digest)],
            volumes=[docker.ContainerVolumeArgs(host_path=host, container_path=inside,
                                                read_only=read_only)
                     for host, inside, read_only in plan.mounts],
            must_run=True,
            opts=pulumi.ResourceOptions(
                parent=self, provider=self.provider, depends_on=[image, *depends_on],
                # A fixed name and host-network port: the old one must go first.
                delete_before_replace=True))
        ready = command.remote.Command(
            f"{role}-ready", connection=self.connection, create=ready_command(cfg, plan),
            stdin=WAIT_HEALTHY.read_text(), triggers=[container.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[container]))
        return container, ready
