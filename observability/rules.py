"""Prometheus recording and alerting rules for a kimipd serving stack (pure: model in, rule
groups out). Each alert has a promtool test in observability/rule-tests/.

Series they read (all from the serving stack's prometheusTargets, job `kimipd`, labelled stack,
role, node, and for SGLang ranks group, mode, rank):
- `up`: Prometheus's own scrape result per target;
- SGLang 0.5.19 (srt/observability/metrics_collector.py): `sglang:time_to_first_token_seconds`
  (histogram, rank 0's tokenizer manager), `sglang:gen_throughput` and `sglang:num_queue_reqs`
  (gauges, per scheduler; an idle scheduler reports gen_throughput 0 with its waiting queue every
  30 s, managers/scheduler_components/metrics_reporter.py);
- sglang-router 0.3.2 with `--prometheus-port` (router.kind rust): `smg_worker_health{worker=URL}`
  (1 healthy, 0 not). It carries no worker type, so a worker is matched to its group by URL,
  which is the group's rank-0 target address.
MiniLB serves no metrics: for it, "no healthy worker of a mode" is judged from the scrapes of
the groups themselves (KimipdNoServingGroup), which also holds for the rust router.
"""

from __future__ import annotations

from typing import Any

import yaml

from .config import AlertsSpec

JOB = "kimipd"
RULES_FILE = "kimipd.rules.yml"


def duration(seconds: float) -> str:
    """Prometheus's duration syntax (`90s`, `0s`)."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{int(seconds * 1000)}ms"


def recording_rules(alerts: AlertsSpec) -> list[dict[str, str]]:
    ranks = f'up{{job="{JOB}", group!=""}}'
    return [
        {"record": "kimipd:group_ranks:count",
         "expr": f"count by (stack, group, mode) ({ranks})"},
        {"record": "kimipd:group_ranks_up:sum",
         "expr": f"sum by (stack, group, mode) ({ranks})"},
        # 1 while every rank of the group answers, else 0: a group serves whole or not at all.
        {"record": "kimipd:group_all_ranks_up:bool",
         "expr": "kimipd:group_ranks_up:sum == bool kimipd:group_ranks:count"},
        # Each group's rank 0 (instance ADDRESS:PORT): what the router calls a worker.
        {"record": "kimipd:group_worker:info",
         "expr": f'group by (stack, group, mode, instance) (up{{job="{JOB}", rank="0"}})'},
        # The rust router's view of each worker, with the worker's group and mode.
        {"record": "kimipd:router_worker_health:by_group",
         "expr": (f'label_replace(smg_worker_health{{job="{JOB}"}}, "instance", "$1", "worker", '
                  '"https?://([^/]+)/?") * on (stack, instance) group_left (group, mode) '
                  "kimipd:group_worker:info")},
        {"record": "kimipd:router_healthy_workers:sum",
         "expr": "sum by (stack, mode) (kimipd:router_worker_health:by_group)"},
        {"record": "kimipd:ttft_seconds:quantile",
         "expr": (f"histogram_quantile({alerts.ttft_quantile:g}, sum by (stack, group, mode, le) "
                  f'(rate(sglang:time_to_first_token_seconds_bucket{{job="{JOB}"}}'
                  f"[{duration(alerts.ttft_window_seconds)}])))")},
        {"record": "kimipd:gen_throughput:sum",
         "expr": f'sum by (stack, group, mode) (sglang:gen_throughput{{job="{JOB}"}})'},
        {"record": "kimipd:queue_reqs:sum",
         "expr": f'sum by (stack, group, mode) (sglang:num_queue_reqs{{job="{JOB}"}})'},
    ]


def alert_rules(alerts: AlertsSpec, ttft_seconds: float, ttft_source: str) -> list[dict[str, Any]]:
    """Each alert: a templated `summary` (what, where) and a fixed `action` (what to run)."""
    def alert(name: str, expr: str, for_seconds: float, severity: str, summary: str,
              action: str) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": duration(for_seconds),
                "labels": {"severity": severity},
                "annotations": {"summary": summary, "action": action}}

    return [
        alert("KimipdTargetDown", "up == 0", alerts.target_down_for_seconds, "warning",
              "{{ $labels.instance }} ({{ $labels.role }}) does not answer its scrape",
              "scripts/kimipd status; the process is down or its port unreachable"),
        alert("KimipdGroupRankDown",
              "kimipd:group_ranks_up:sum < kimipd:group_ranks:count",
              alerts.rank_down_for_seconds, "critical",
              "{{ $labels.mode }} group {{ $labels.group }}: {{ $value }} rank(s) up, not all",
              # A lone rank cannot rejoin its NCCL group: the whole group is replaced.
              "pulumi up --refresh on the serving stack (replaces the whole group)"),
        alert("KimipdRouterNoHealthyWorker",
              "(kimipd:router_healthy_workers:sum == 0 or 0 * count by (stack, mode) "
              "(kimipd:group_worker:info) unless on (stack, mode) "
              "kimipd:router_healthy_workers:sum) and on (stack) "
              f'(up{{job="{JOB}", role="router"}} == 1)',
              alerts.no_healthy_worker_for_seconds, "critical",
              "the router of {{ $labels.stack }} has no healthy {{ $labels.mode }} worker",
              "every request fails; see the groups' alerts and scripts/kimipd status"),
        alert("KimipdNoServingGroup",
              "sum by (stack, mode) (kimipd:group_all_ranks_up:bool) == 0",
              alerts.no_healthy_worker_for_seconds, "critical",
              "no {{ $labels.mode }} group of {{ $labels.stack }} has every rank up",
              "every request fails (MiniLB or rust); see the groups' alerts"),
        alert("KimipdTimeToFirstTokenHigh",
              f"kimipd:ttft_seconds:quantile > {ttft_seconds:g}",
              alerts.ttft_for_seconds, "warning",
              f"p{alerts.ttft_quantile * 100:g} time to first token of {{{{ $labels.group }}}} is "
              f"{{{{ $value }}}}s, above {ttft_seconds:g}s ({ttft_source})",
              "scripts/kimipd verify replays the verification baseline"),
        alert("KimipdDecodeStalled",
              'kimipd:gen_throughput:sum{mode="decode"} == 0 and on (stack, group, mode) '
              "kimipd:queue_reqs:sum > 0",
              alerts.stalled_for_seconds, "critical",
              "decode group {{ $labels.group }} generates nothing while requests wait",
              "hung rather than idle (KV transfer, NCCL): scripts/kimipd logs, then restart the "
              "group (restartGeneration)"),
        alert("KimipdMooncakeMasterDown",
              f'up{{job="{JOB}", role="mooncake-master"}} == 0 or '
              f'absent(up{{job="{JOB}", role="mooncake-master"}})',
              alerts.mooncake_master_down_for_seconds, "critical",
              "the Mooncake master of {{ $labels.stack }} does not answer",
              "pulumi up --refresh on the serving stack"),
    ]


def rules_document(alerts: AlertsSpec, ttft_seconds: float, ttft_source: str) -> dict[str, Any]:
    return {"groups": [
        {"name": "kimipd-recording", "rules": recording_rules(alerts)},
        {"name": "kimipd-alerts", "rules": alert_rules(alerts, ttft_seconds, ttft_source)},
    ]}


def rules_yaml(alerts: AlertsSpec, ttft_seconds: float, ttft_source: str) -> str:
    return yaml.safe_dump(rules_document(alerts, ttft_seconds, ttft_source), sort_keys=False,
                          width=100)
