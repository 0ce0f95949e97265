"""What `kimipd reconcile` did and saw, as Prometheus metric families: one registry that
--metrics-file is written from and --metrics-listen serves."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .heal_policy import Decision, Memory
from .virtual_ip import VirtualIpReport, virtual_ip_families


def metric_families(stack: str, memory: Memory, decision: Decision | None,
                    now: float, virtual_ip: VirtualIpReport | None = None,
                    hung: tuple[str, ...] = (),
                    clients: Mapping[str, Mapping[str, int]] | None = None) -> list[Metric]:
    """What reconcile did and saw, as Prometheus metric families (with the door on two nodes,
    also who holds the virtual IP and each keepalived's state, from the pass's status). HUNG:
    the units the pass found hung (running, not serving), each exported with the pass's
    decision, so that a hang reconcile does not heal is alerted (KimipdUnitHungNotHealed)."""
    per_unit = ["stack", "unit"]
    heals = CounterMetricFamily(
        "kimipd_reconcile_heals_total",
        "Heals whose refresh and up converged, per unit (group, mooncake-master, router, door, "
        "router-a, router-b, keepalived).",
        labels=per_unit)
    failures = CounterMetricFamily("kimipd_reconcile_heal_failures_total",
                                   "Heals that failed, per unit.", labels=per_unit)
    last_hour = GaugeMetricFamily(
        "kimipd_reconcile_heals_last_hour",
        "Heals started in the last hour, per unit (compared with --max-heals-per-hour).",
        labels=per_unit)
    for name, unit in sorted(memory.units.items()):
        heals.add_metric([stack, name], unit.healed_total)
        failures.add_metric([stack, name], unit.failed_total)
        last_hour.add_metric([stack, name], len([t for t in unit.heals if now - t < 3600]))
    broken = GaugeMetricFamily("kimipd_reconcile_broken_units",
                               "Units found broken by the last pass.", labels=["stack"])
    broken.add_metric([stack], len(decision.units) if decision
                      and decision.kind not in ("healed", "re-registered", "rollout-under-way")
                      else 0)
    families: list[Metric] = [heals, failures, last_hour, broken]
    failing = GaugeMetricFamily(
        "kimipd_reconcile_heal_failing_resource",
        "1 per resource that failed the last failed heal (until a heal converges).",
        labels=["stack", "resource"])
    for resource in memory.last_failure_resources:
        failing.add_metric([stack, resource], 1)
    families.append(failing)
    lost = GaugeMetricFamily(
        "kimipd_reconcile_node_unreachable_since_timestamp_seconds",
        "When reconcile first found the node not answering over SSH; heals wait for it.",
        labels=["stack", "node"])
    for node, since in sorted(memory.lost_since.items()):
        lost.add_metric([stack, node], since)
    families.append(lost)
    hung_since = GaugeMetricFamily(
        "kimipd_reconcile_hung_since_timestamp_seconds",
        "Per unit the last pass found hung (every container running, not serving): when "
        "reconcile first found it broken, and the pass's decision (heal: being healed now; "
        "grace, limited, backoff, unreachable, locked, human-window, pending-changes, "
        "would-heal, heal-failed: not healed, and why).", labels=["stack", "unit", "decision"])
    if decision is not None and decision.kind != "healed":
        for name in hung:
            unit = memory.units.get(name)
            since = unit.broken_since if unit is not None else None
            hung_since.add_metric([stack, name, decision.kind], since if since is not None else now)
    families.append(hung_since)
    if decision is not None:
        last_decision = GaugeMetricFamily(
            "kimipd_reconcile_last_decision",
            "1 for the last pass's decision (healthy, grace, healed, limited, ...).",
            labels=["stack", "decision"])
        last_decision.add_metric([stack, decision.kind], 1)
        families.append(last_decision)
    if memory.last_pass is not None:
        last_pass = GaugeMetricFamily("kimipd_reconcile_last_pass_timestamp_seconds",
                                      "When the last pass ended.", labels=["stack"])
        last_pass.add_metric([stack], memory.last_pass)
        families.append(last_pass)
    if memory.last_healthy is not None:
        last_healthy = GaugeMetricFamily("kimipd_reconcile_last_healthy_timestamp_seconds",
                                         "When a pass last found every unit serving.",
                                         labels=["stack"])
        last_healthy.add_metric([stack], memory.last_healthy)
        families.append(last_healthy)
    return families + virtual_ip_families(stack, virtual_ip) + client_families(stack, clients)


def client_families(stack: str, clients: Mapping[str, Mapping[str, int]] | None) -> list[Metric]:
    """With client keys, each door's requests per client (its stick table, read by the pass's
    status): HAProxy's own exporter has no per-client series."""
    if not clients:
        return []
    requests = CounterMetricFamily(
        "kimipd_door_client_requests",
        "Requests the door on this node let in per client key (router.door.clientKeys; kimipd: "
        "routerApiKey, the program's own), since that door last loaded.",
        labels=["stack", "node", "client"])
    for node, counts in sorted(clients.items()):
        for client, count in sorted(counts.items()):
            requests.add_metric([stack, node, client], count)
    return [requests]


class ReconcileMetrics(Collector):
    """The last pass's metric families, in the one registry that --metrics-file is written from
    and --metrics-listen serves, so both always say the same."""

    def __init__(self) -> None:
        self.families: list[Metric] = []
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def collect(self) -> Iterable[Metric]:
        # A scrape during a pass reads the previous pass's families: they are replaced whole.
        return self.families

    def update(self, stack: str, memory: Memory, decision: Decision | None, now: float,
               virtual_ip: VirtualIpReport | None = None, hung: tuple[str, ...] = (),
               clients: Mapping[str, Mapping[str, int]] | None = None) -> None:
        self.families = metric_families(stack, memory, decision, now, virtual_ip, hung,
                                        clients)


class MetricsEndpoint:
    """http://ADDRESS:PORT/metrics: prometheus_client's server on REGISTRY, for a Prometheus
    scrape; close() stops it."""

    def __init__(self, address: str, port: int, registry: CollectorRegistry) -> None:
        self.server, self.thread = start_http_server(port, address, registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
