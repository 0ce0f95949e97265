"""What runs on the observability node, rendered from the model (pure: no Pulumi here).

Layout on the node (cfg.directory):
  prometheus/etc/prometheus.yml       -> /etc/prometheus (read-only)
  prometheus/etc/kimipd.rules.yml
  prometheus/etc/targets/kimipd.json  the serving stack's targets (file_sd; re-read on change)
  prometheus/data                     -> /prometheus (uid 65534, as the official image runs)
  alertmanager/etc/alertmanager.yml   -> /etc/alertmanager (read-only)
  alertmanager/data                   -> /alertmanager
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from .config import ObservabilityConfig
from .rules import JOB, RULES_FILE, duration, rules_yaml

# The official images' user (prom/prometheus and prom/alertmanager run as nobody).
RUN_AS = "65534:65534"
PROMETHEUS_CONTAINER = "kimipd-obs-prometheus"
ALERTMANAGER_CONTAINER = "kimipd-obs-alertmanager"
TARGETS_FILE = "targets/kimipd.json"
RECEIVER = "kimipd-webhook"


def node_paths(cfg: ObservabilityConfig) -> dict[str, str]:
    root = cfg.directory.rstrip("/")
    return {"prometheus_etc": f"{root}/prometheus/etc",
            "prometheus_data": f"{root}/prometheus/data",
            "alertmanager_etc": f"{root}/alertmanager/etc",
            "alertmanager_data": f"{root}/alertmanager/data"}


def prometheus_url(cfg: ObservabilityConfig) -> str:
    return f"http://{cfg.node.address}:{cfg.prometheus.port}"


def alertmanager_url(cfg: ObservabilityConfig) -> str:
    return f"http://{cfg.node.address}:{cfg.alertmanager.port}"


def targets_json(targets: list[dict[str, Any]]) -> str:
    """The file_sd file: the serving stack's prometheusTargets, as it lists them."""
    return json.dumps(targets, indent=2, sort_keys=True) + "\n"


def prometheus_yaml(cfg: ObservabilityConfig, serving_stack: str) -> str:
    interval = cfg.prometheus.scrape_interval_seconds
    document = {
        "global": {
            "scrape_interval": duration(interval),
            "evaluation_interval": duration(cfg.prometheus.evaluation_interval_seconds),
            "external_labels": {"serving_stack": serving_stack},
        },
        "rule_files": [f"/etc/prometheus/{RULES_FILE}"],
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"{cfg.node.address}:{cfg.alertmanager.port}"]}]}]},
        "scrape_configs": [
            {"job_name": JOB,
             "scrape_timeout": duration(min(interval, 10)),
             # Prometheus watches the file (inotify on the mounted directory) and re-reads it
             # on change; the interval is only the fallback.
             "file_sd_configs": [{"files": [f"/etc/prometheus/{TARGETS_FILE}"],
                                  "refresh_interval": duration(max(interval, 30))}]},
            {"job_name": "prometheus",
             "static_configs": [{"targets": [f"{cfg.node.address}:{cfg.prometheus.port}"],
                                 "labels": {"role": "prometheus", "node": cfg.node.address}}]},
            {"job_name": "alertmanager",
             "static_configs": [{"targets": [f"{cfg.node.address}:{cfg.alertmanager.port}"],
                                 "labels": {"role": "alertmanager",
                                            "node": cfg.node.address}}]},
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


def alertmanager_yaml(cfg: ObservabilityConfig) -> str:
    am = cfg.alertmanager
    document = {
        "route": {
            "receiver": RECEIVER,
            "group_by": ["alertname", "stack", "group", "mode"],
            "group_wait": duration(am.group_wait_seconds),
            "group_interval": duration(am.group_interval_seconds),
            "repeat_interval": duration(am.repeat_interval_seconds),
        },
        "receivers": [{"name": RECEIVER, "webhook_configs": [
            {"url": am.receiver_url, "send_resolved": True}]}],
        # One page per fault: a rank's own target-down is implied by its group's rank-down, the
        # Mooncake master's by its own alert, a slot router's by its slot down at the door, and
        # each slot down by the door having none up.
        "inhibit_rules": [
            {"source_matchers": ["alertname=KimipdGroupRankDown"],
             "target_matchers": ["alertname=KimipdTargetDown"], "equal": ["stack", "group"]},
            {"source_matchers": ["alertname=KimipdMooncakeMasterDown"],
             "target_matchers": ["alertname=KimipdTargetDown"], "equal": ["stack", "role"]},
            {"source_matchers": ["alertname=KimipdDoorSlotDown"],
             "target_matchers": ["alertname=KimipdTargetDown", "role=router"],
             "equal": ["stack", "slot"]},
            {"source_matchers": ["alertname=KimipdDoorNoSlotUp"],
             "target_matchers": ["alertname=KimipdDoorSlotDown"], "equal": ["stack"]},
            # The door down: its slots' states are unknown (its exporter is gone), so the slot
            # alerts and its own target say nothing more.
            {"source_matchers": ["alertname=KimipdDoorDown"],
             "target_matchers": ["alertname=~KimipdDoorSlotDown|KimipdDoorNoSlotUp"],
             "equal": ["stack"]},
            {"source_matchers": ["alertname=KimipdDoorDown"],
             "target_matchers": ["alertname=KimipdTargetDown", "role=door"],
             "equal": ["stack"]},
            {"source_matchers": ["alertname=KimipdDoorSpareDown"],
             "target_matchers": ["alertname=KimipdTargetDown", "role=door"],
             "equal": ["stack", "node"]},
            # A lost node: every target there is down; the node's alert says it once.
            {"source_matchers": ["alertname=KimipdNodeLost"],
             "target_matchers": ["alertname=~KimipdTargetDown|KimipdDoorSpareDown"],
             "equal": ["stack", "node"]},
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


def rules_file(cfg: ObservabilityConfig, ttft_seconds: float, ttft_source: str) -> str:
    return rules_yaml(cfg.alerts, ttft_seconds, ttft_source)


def digest(*texts: str) -> str:
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]


def directories_command(cfg: ObservabilityConfig) -> str:
    """The node's directories: config read-only to the containers, data owned by their user."""
    paths = node_paths(cfg)
    uid, gid = RUN_AS.split(":")
    return " && ".join([
        "set -e",
        f"install -d -m 0755 {shlex.quote(paths['prometheus_etc'] + '/targets')} "
        f"{shlex.quote(paths['alertmanager_etc'])}",
        f"install -d -m 0750 -o {uid} -g {gid} {shlex.quote(paths['prometheus_data'])} "
        f"{shlex.quote(paths['alertmanager_data'])}",
    ])


def write_file_command(path: str) -> str:
    """Writes stdin to PATH atomically (a temporary file in the same directory, then rename), so
    Prometheus never reads half a file and its directory watch sees one change."""
    directory, name = path.rsplit("/", 1)
    temporary = f"{directory}/.{name}.tmp"
    return (f"set -e; umask 022; cat > {shlex.quote(temporary)}; "
            f"mv -f {shlex.quote(temporary)} {shlex.quote(path)}")


@dataclass(frozen=True)
class ContainerPlan:
    """One container: what a reviewer reads to see what runs on the node."""

    name: str
    image: str
    entrypoint: list[str]
    command: list[str]
    mounts: list[tuple[str, str, bool]]  # (host path, container path, read-only)
    ready_url: str


def prometheus_plan(cfg: ObservabilityConfig) -> ContainerPlan:
    paths, port = node_paths(cfg), cfg.prometheus.port
    return ContainerPlan(
        name=PROMETHEUS_CONTAINER, image=cfg.prometheus.image, entrypoint=["/bin/prometheus"],
        command=["--config.file=/etc/prometheus/prometheus.yml",
                 "--storage.tsdb.path=/prometheus",
                 f"--storage.tsdb.retention.time={cfg.prometheus.retention_days}d",
                 f"--web.listen-address=:{port}",
                 f"--web.external-url={prometheus_url(cfg)}"],
        mounts=[(paths["prometheus_etc"], "/etc/prometheus", True),
                (paths["prometheus_data"], "/prometheus", False)],
        ready_url=f"http://127.0.0.1:{port}/-/ready")


def alertmanager_plan(cfg: ObservabilityConfig) -> ContainerPlan:
    paths, port = node_paths(cfg), cfg.alertmanager.port
    return ContainerPlan(
        name=ALERTMANAGER_CONTAINER, image=cfg.alertmanager.image,
        entrypoint=["/bin/alertmanager"],
        command=["--config.file=/etc/alertmanager/alertmanager.yml",
                 "--storage.path=/alertmanager",
                 f"--web.listen-address=:{port}",
                 # One instance: no gossip port (9094) to open or collide on the host network.
                 "--cluster.listen-address=",
                 f"--web.external-url={alertmanager_url(cfg)}"],
        mounts=[(paths["alertmanager_etc"], "/etc/alertmanager", True),
                (paths["alertmanager_data"], "/alertmanager", False)],
        ready_url=f"http://127.0.0.1:{port}/-/ready")


def ready_command(cfg: ObservabilityConfig, plan: ContainerPlan, timeout_seconds: int = 120) -> str:
    """The serving project's gate, assets/wait-healthy.sh, fed on stdin (nothing of the serving
    project need be on this node): polls the container's /-/ready on the node, fails naming the
    container with its log tail."""
    return shlex.join(["bash", "-s", "--", "--url", plan.ready_url, "--container", plan.name,
                       "--node", cfg.node.address, "--timeout", str(timeout_seconds),
                       "--interval", "0.5"])
