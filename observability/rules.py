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
  which is the group's rank-0 target address. Behind a door each slot's router is a target of
  its own (role router, `slot` a or b), so every router rule is per slot;
- the door (router.door): HAProxy 2.6.12's built-in exporter (role door), seen first-hand on
  Debian 12's package: `haproxy_server_status{proxy="slots", server="slot-a", state=S}`, 1 for
  the server's one current state S of UP, DOWN, DRAIN, MAINT, NOLB (a drained server whose checks
  fail shows DOWN), and `haproxy_backend_active_servers{proxy="slots"}`, the servers UP with a
  non-zero weight (a drained one does not count): 0 and the door answers every request 503.
- the door's virtual IP (router.door.nodes with virtualIp): no target exports it (HAProxy's
  exporter does not know the address; keepalived 2.2.7 exports only SNMP), so `kimipd
  reconcile` does, from each pass's status: `kimipd_virtual_ip_held{stack, node, address}` (1
  while the address is on that door node's interface) and `kimipd_keepalived_state{stack, node,
  state}` (1 for MASTER, BACKUP, FAULT, STOP, absent or unknown). They reach Prometheus through
  reconcile's --metrics-file and node_exporter's textfile collector (ops/systemd's unit writes
  it), not through the stack's targets: their rules select no `job`, and Prometheus must scrape
  that node_exporter;
MiniLB serves no metrics: for it, "no healthy worker of a mode" is judged from the scrapes of
the groups themselves (KimipdNoServingGroup), which also holds for the rust router.
"""

from __future__ import annotations

from typing import Any

import yaml

from .config import AlertsSpec

JOB = "kimipd"
RULES_FILE = "kimipd.rules.yml"
MODES = ("prefill", "decode")


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
        # Per router: behind a door a slot whose router lost its decode workers is not saved by
        # the other slot's (no `slot` label without a door).
        {"record": "kimipd:router_healthy_workers:sum",
         "expr": "sum by (stack, slot, mode) (kimipd:router_worker_health:by_group)"},
        # Each router that answers its scrape, once per mode that has a group: it should list a
        # worker of each. PromQL joins no many (slots) to many (modes), so the modes are spelled.
        {"record": "kimipd:router_expected_mode:info",
         "expr": "(" + " or ".join(
             f'label_replace(group by (stack, slot) (up{{job="{JOB}", role="router"}} == 1), '
             f'"mode", "{mode}", "", "")' for mode in MODES)
                 + ") and on (stack, mode) kimipd:group_worker:info"},
        # The door's view of each slot: 1 while UP (it takes new requests), 0 while DOWN (its
        # /readiness checks fail, drained or not), DRAIN, MAINT or NOLB; `slot` from the server
        # name, as the slot routers' targets carry it.
        {"record": "kimipd:door_slot_up:bool",
         "expr": (f'label_replace(sum without (state) (haproxy_server_status{{job="{JOB}", '
                  'proxy="slots", state="UP"}), "slot", "$1", "server", "slot-(.+)")')},
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
    """Each alert: a templated `summary` (what, where) and an `action` (what to run)."""
    def alert(name: str, expr: str, for_seconds: float, severity: str, summary: str,
              action: str) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": duration(for_seconds),
                "labels": {"severity": severity},
                "annotations": {"summary": summary, "action": action}}

    return [
        alert("KimipdTargetDown", "up == 0", alerts.target_down_for_seconds, "warning",
              "{{ $labels.instance }} ({{ $labels.role }}) does not answer its scrape",
              "scripts/kimipd status; the process is down or its port unreachable"),
        # Every target on a node silent at once: the node is gone (link, power, kernel), not one
        # process; reconcile waits for it and heals once it answers. 30 s: two scrapes in a row.
        alert("KimipdNodeLost", f'max by (stack, node) (up{{job="{JOB}"}}) == 0',
              alerts.node_lost_for_seconds, "critical",
              "node {{ $labels.node }} of {{ $labels.stack }} answers no scrape: every process "
              "there is unreachable",
              "scripts/kimipd status -s {{ $labels.stack }} names what runs there; reconcile "
              "heals once it answers; a node that will not come back: set its nodes[].out and "
              "scripts/kimipd -s {{ $labels.stack }} up (docs/healing.md)"),
        alert("KimipdGroupRankDown",
              "kimipd:group_ranks_up:sum < kimipd:group_ranks:count",
              alerts.rank_down_for_seconds, "critical",
              "{{ $labels.mode }} group {{ $labels.group }}: {{ $value }} rank(s) up, not all",
              # A lone rank cannot rejoin its NCCL group: the whole group is replaced.
              "pulumi up --refresh on the serving stack (replaces the whole group)"),
        # Per router (slot); not for a slot the door sends nothing (down, drained, in
        # maintenance): a slot being replaced lists no worker until it is registered again, and
        # a slot out of the door costs no request while the other serves (KimipdDoorSlotDown,
        # KimipdDoorNoSlotUp say so).
        alert("KimipdRouterNoHealthyWorker",
              "(kimipd:router_healthy_workers:sum == 0 or (0 * kimipd:router_expected_mode:info "
              "unless on (stack, slot, mode) kimipd:router_healthy_workers:sum)) "
              f'and on (stack, slot) (up{{job="{JOB}", role="router"}} == 1) '
              "unless on (stack, slot) (kimipd:door_slot_up:bool == 0)",
              alerts.no_healthy_worker_for_seconds, "critical",
              "the router of {{ $labels.stack }}{{ if $labels.slot }} in slot "
              "{{ $labels.slot }}{{ end }} has no healthy {{ $labels.mode }} worker",
              "every request {{ if $labels.slot }}the door sends it {{ end }}fails; see the "
              "groups' alerts and scripts/kimipd status"),
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
        # A hang is judged by reconcile, as SGLang's own /health judges it (a one-token generate
        # given SGLANG_HEALTH_CHECK_TIMEOUT): sglang:gen_throughput cannot tell, since a scheduler
        # stuck in a collective stops writing its gauges and they keep their last value. A hung
        # unit reconcile heals is `heal` while it does; any other decision for `for` is a hang
        # left alone (a person's window, pending changes, the hourly limit, a failed heal).
        alert("KimipdUnitHungNotHealed",
              'kimipd_reconcile_hung_since_timestamp_seconds{decision!="heal"}',
              alerts.hung_not_healed_for_seconds, "critical",
              "{{ $labels.unit }} of {{ $labels.stack }} is hung (running, not serving) and "
              "reconcile does not heal it: {{ $labels.decision }}",
              "scripts/kimipd status -s {{ $labels.stack }}; reconcile's log says why "
              "({{ $labels.decision }}, docs/healing.md); scripts/kimipd logs -s "
              "{{ $labels.stack }} --role {{ $labels.unit }}"),
        # A slot not UP at the door: nothing fails while the other serves, but there is no spare.
        # The door itself turns a slot DOWN or UP only after 2 checks in a row (fall 2, rise 2 at
        # healthCheckIntervalMs, 500 ms), so a flap never reaches here; 60 s outlasts a planned
        # replacement of a slot (drained while its requests finish, then stopped, started,
        # registered with every group and 2 checks passed: seconds beyond the longest request)
        # while a slot that died, or that an `up` left drained, is reported within a minute. A
        # drain of requests longer than that fires it during the `up`: a slot out that long is a
        # minute without a spare.
        alert("KimipdDoorSlotDown", "kimipd:door_slot_up:bool == 0",
              alerts.door_slot_down_for_seconds, "warning",
              "slot {{ $labels.slot }} of {{ $labels.stack }} is not UP at the door (down, "
              "drained or in maintenance): the other slot serves alone",
              "scripts/kimipd status -s {{ $labels.stack }} (the door's view of each slot, each "
              "group in each slot); scripts/kimipd logs -s {{ $labels.stack }} --role door "
              "--role router-{{ $labels.slot }}; scripts/kimipd reconcile heals a dead slot"),
        # No slot UP: every request fails now (the door answers 503). A planned change keeps a
        # slot ready at every moment, so this is never a rollout's step; 15 s is two scrapes in a
        # row at the default 15 s interval, so one odd sample does not page.
        alert("KimipdDoorNoSlotUp",
              f'haproxy_backend_active_servers{{job="{JOB}", proxy="slots"}} == 0',
              alerts.door_no_slot_up_for_seconds, "critical",
              "the door of {{ $labels.stack }} has no slot UP: every request fails (503)",
              "scripts/kimipd status -s {{ $labels.stack }}; scripts/kimipd logs -s "
              "{{ $labels.stack }} --role door --role router; see the groups' and the routers' "
              "alerts"),
        # The door itself gone (its exporter, on the port of its /health, unanswered), and no
        # other door of the stack answers: no request gets in at all, whatever the slots. 15 s,
        # as KimipdDoorNoSlotUp.
        alert("KimipdDoorDown",
              f'up{{job="{JOB}", role="door"}} == 0 '
              f'unless on (stack) (up{{job="{JOB}", role="door"}} == 1)',
              alerts.door_no_slot_up_for_seconds, "critical",
              "the door of {{ $labels.stack }} ({{ $labels.instance }}) does not answer: no "
              "request gets in",
              "scripts/kimipd status -s {{ $labels.stack }}; scripts/kimipd logs -s "
              "{{ $labels.stack }} --role door; scripts/kimipd reconcile heals a dead door"),
        # One of two doors gone while the other answers: its keepalived sees its door down and
        # gives the virtual IP up within a second, so clients go on through the other; a lost
        # spare, as KimipdDoorSlotDown, and as long.
        alert("KimipdDoorSpareDown",
              f'up{{job="{JOB}", role="door"}} == 0 '
              f'and on (stack) (up{{job="{JOB}", role="door"}} == 1)',
              alerts.door_slot_down_for_seconds, "warning",
              "the door on {{ $labels.node }} of {{ $labels.stack }} does not answer: the other "
              "door node serves the virtual IP alone",
              "scripts/kimipd status -s {{ $labels.stack }}; scripts/kimipd logs -s "
              "{{ $labels.stack }} --role door; scripts/kimipd reconcile heals a dead door"),
        # The door's virtual IP (reconcile's metrics, see the module's docstring). Two holders:
        # both answer ARP for it, clients follow whichever answered last, VRRP between the door
        # nodes does not pass. None: nothing answers the address. 15 s as KimipdDoorDown; a
        # failover takes under a second, so no pass sees it half done twice.
        alert("KimipdVirtualIpSplitBrain",
              "sum by (stack, address) (kimipd_virtual_ip_held) > 1",
              alerts.door_no_slot_up_for_seconds, "critical",
              "{{ $value }} door nodes of {{ $labels.stack }} hold the virtual IP "
              "{{ $labels.address }} at once (split brain)",
              "scripts/kimipd status -s {{ $labels.stack }} (who holds it, each keepalived's "
              "state); check the link between the door nodes and their firewall's VRRP rule; "
              "scripts/kimipd logs -s {{ $labels.stack }} --role keepalived"),
        alert("KimipdVirtualIpNoHolder",
              "sum by (stack, address) (kimipd_virtual_ip_held) == 0",
              alerts.door_no_slot_up_for_seconds, "critical",
              "no door node of {{ $labels.stack }} holds the virtual IP {{ $labels.address }}: "
              "no request gets in",
              "scripts/kimipd status -s {{ $labels.stack }} (each keepalived's state: FAULT is "
              "its door not answering); scripts/kimipd logs -s {{ $labels.stack }} --role "
              "keepalived --role door"),
        # keepalived not running on a door node: the address stays where it is, so nothing
        # fails now, but it cannot move (to that node, or away from it when its door dies): a
        # lost spare, as KimipdDoorSlotDown, and as long. A holder's keepalived SIGKILLed leaves
        # the address on its interface, and the other takes it too: KimipdVirtualIpSplitBrain.
        alert("KimipdKeepalivedDown", 'kimipd_keepalived_state{state="absent"} == 1',
              alerts.door_slot_down_for_seconds, "warning",
              "keepalived on door node {{ $labels.node }} of {{ $labels.stack }} is not "
              "running: the virtual IP cannot move there or away from there",
              "scripts/kimipd logs -s {{ $labels.stack }} --role keepalived; scripts/kimipd "
              "reconcile heals a dead keepalived"),
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
