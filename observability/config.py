"""The observability stack's configuration (`kimipd-observability:*`) as one validated model.

Stack YAML -> `ObservabilityConfig`, checked once, before anything is touched; below this module
nothing reads `pulumi.Config`. Sections it shares with the serving project (a node, the SSH
connection) are the serving project's own models, so both read a node the same way.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from components.config import ConfigError, ConnectionSpec, NodeSpec
from components.config.base import Model
from components.config.grammars import absolute_path, image_reference_problem
from components.config.messages import validation_problems

CONFIG_NAMESPACE = "kimipd-observability"
# Read with `Config.get_secret`; never enters the model.
SECRET_KEYS = frozenset({"sshPrivateKey"})
# A stack of another project, as StackReference takes it on a self-managed (file) backend or
# Pulumi Cloud: ORGANIZATION/PROJECT/STACK ("organization" on a file backend).
_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def pinned_image(value: str, key: str, example: str) -> str:
    """VALUE if docker accepts it and it names a digest; else why not and the fix."""
    problem = image_reference_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r} {problem}; write [REGISTRY[:PORT]/]REPOSITORY[:TAG]"
                         f"@sha256:DIGEST, e.g. {example}")
    if "@sha256:" not in value:
        raise ValueError(
            f"{value!r} is not pinned by digest, so each node's pull may run another build; "
            f"pin it: `docker buildx imagetools inspect {value}` prints the digest, then write "
            f"{value}@sha256:DIGEST (e.g. {example})")
    return value


class PrometheusSpec(Model):
    # The official image (prom/prometheus), or the sim's Debian build; pinned by digest.
    image: str
    port: int = Field(default=9090, ge=1, le=65535)
    scrape_interval_seconds: int = Field(default=15, ge=1, le=300)
    evaluation_interval_seconds: int = Field(default=15, ge=1, le=300)
    retention_days: int = Field(default=15, ge=1)

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        return pinned_image(value, "prometheus.image",
                            "prom/prometheus:v2.53.0@sha256:<64 hex digits>")


class AlertmanagerSpec(Model):
    image: str
    port: int = Field(default=9093, ge=1, le=65535)
    # Where every alert goes: an Alertmanager webhook receiver (POST of the alert group as JSON).
    receiver_url: str
    group_wait_seconds: int = Field(default=30, ge=0)
    group_interval_seconds: int = Field(default=300, ge=1)
    repeat_interval_seconds: int = Field(default=14400, ge=1)

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        return pinned_image(value, "alertmanager.image",
                            "prom/alertmanager:v0.27.0@sha256:<64 hex digits>")

    @field_validator("receiver_url")
    @classmethod
    def _webhook(cls, value: str) -> str:
        parsed = urllib.parse.urlsplit(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL; write the webhook receiver's full "
                             "URL, e.g. http://10.0.0.5:8080/alerts")
        return value


class AlertsSpec(Model):
    """How long each condition must hold before its alert fires (the rules' `for`), and the
    time-to-first-token ceiling."""

    target_down_for_seconds: int = Field(default=60, ge=0)
    # Every target on one node silent: the node (its link, its power), not a process.
    node_lost_for_seconds: int = Field(default=30, ge=0)
    rank_down_for_seconds: int = Field(default=30, ge=0)
    no_healthy_worker_for_seconds: int = Field(default=30, ge=0)
    mooncake_master_down_for_seconds: int = Field(default=60, ge=0)
    # The door (router.door): one slot out of service, and none (observability/rules.py says why
    # these lengths).
    door_slot_down_for_seconds: int = Field(default=60, ge=0)
    door_no_slot_up_for_seconds: int = Field(default=15, ge=0)
    # A hung unit reconcile does not heal: past its grace (60 s) a heal starts, so 3 minutes
    # of another decision is a hang left alone.
    hung_not_healed_for_seconds: int = Field(default=180, ge=0)
    ttft_for_seconds: int = Field(default=300, ge=0)
    # Unset: derived from the serving stack's kimipd:verification baseline (its `verification`
    # output); set, it wins.
    ttft_seconds: float | None = Field(default=None, gt=0)
    ttft_quantile: float = Field(default=0.9, gt=0, lt=1)
    ttft_window_seconds: int = Field(default=300, ge=1)


class ObservabilityConfig(Model):
    # The serving stack read through StackReference, e.g. organization/kimipd/pro6000.
    serving_stack: str
    # Where Prometheus and Alertmanager run (host network, as every kimipd container).
    node: NodeSpec
    connection: ConnectionSpec = ConnectionSpec()
    # On the node: config files, the targets file and both data directories.
    directory: str = "/var/lib/kimipd-observability"
    prometheus: PrometheusSpec
    alertmanager: AlertmanagerSpec
    alerts: AlertsSpec = AlertsSpec()

    @field_validator("serving_stack")
    @classmethod
    def _qualified(cls, value: str) -> str:
        if not _STACK_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a fully qualified stack name; write ORGANIZATION/PROJECT/STACK, "
                "e.g. organization/kimipd/pro6000 (a file backend's organization is "
                "`organization`)")
        return value

    @field_validator("directory")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute_path(value, "the observability files' directory on the node",
                             "/var/lib/kimipd-observability")

    @model_validator(mode="after")
    def _ports_apart(self) -> ObservabilityConfig:
        if self.prometheus.port == self.alertmanager.port:
            raise ValueError(
                f"alertmanager.port: {self.alertmanager.port} is prometheus.port too, and both "
                f"run with host networking on {self.node.address}: give them different ports "
                "(defaults 9090 and 9093).")
        return self


def load_observability_config(raw: Mapping[str, Any]) -> ObservabilityConfig:
    """Validate the `kimipd-observability:*` values (namespace stripped) or raise ConfigError."""
    try:
        return ObservabilityConfig.model_validate(dict(raw))
    except ValidationError as error:
        lines = validation_problems(error, ObservabilityConfig, CONFIG_NAMESPACE)
        raise ConfigError(f"invalid {CONFIG_NAMESPACE} stack configuration:\n  "
                          + "\n  ".join(lines)) from None
