"""observability/__main__.py under Pulumi's mocks: what it registers on its node, what a change
of the serving stack's targets touches, and what it refuses before registering anything."""

from __future__ import annotations

import json

import pytest

from tests.program.harness import PRIVATE_KEY
from tests.program.observability_harness import (
    observability_values,
    run_observability,
    run_observability_refused,
    serving_outputs,
)

pytestmark = pytest.mark.timeout(120)

CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"


def test_the_serving_stack_is_read_and_both_containers_run_on_the_node() -> None:
    run, mocks = run_observability(observability_values(), serving_outputs())
    assert mocks.references == ["organization/kimipd/sim"]
    containers = {r.name: r for r in run.of_type(CONTAINER)}
    assert set(containers) == {"prometheus", "alertmanager"}
    prometheus = containers["prometheus"].inputs
    assert prometheus["name"] == "kimipd-obs-prometheus"
    assert prometheus["networkMode"] == "host" and prometheus["user"] == "65534:65534"
    assert prometheus["entrypoints"] == ["/bin/prometheus"]
    assert "--web.external-url=http://10.231.60.4:9090" in prometheus["command"]
    assert {v["containerPath"]: v.get("readOnly", False) for v in prometheus["volumes"]} == {
        "/etc/prometheus": True, "/prometheus": False}
    assert run.waits_for(containers["prometheus"], run.named("alertmanager-ready"))
    assert run.waits_for(run.named("prometheus-ready"), containers["prometheus"])
    provider = run.named("observability-docker").inputs
    assert provider["host"] == "ssh://root@10.231.60.4:22"
    assert run.stack_outputs == {"prometheusUrl": "http://10.231.60.4:9090",
                                 "alertmanagerUrl": "http://10.231.60.4:9093"}


def test_the_targets_file_holds_the_serving_stacks_targets_and_feeds_no_container() -> None:
    outputs = serving_outputs()
    run, _ = run_observability(observability_values(), outputs)
    targets = run.named("prometheus-targets")
    assert json.loads(targets.inputs["stdin"]) == outputs["prometheusTargets"]
    assert targets.inputs["create"].endswith("/prometheus/etc/targets/kimipd.json")
    prometheus = run.named("prometheus")
    assert run.waits_for(prometheus, targets), "Prometheus must start with the file in place"
    assert targets.inputs["stdin"] not in json.dumps(prometheus.inputs)


def test_a_change_of_targets_changes_the_targets_file_and_nothing_else() -> None:
    """1P1D -> 2P2D in the serving stack: only the targets file's input differs."""
    before, _ = run_observability(observability_values(), serving_outputs())
    two_by_two = serving_outputs()["prometheusTargets"][:1] + [
        {"targets": [f"10.231.60.{n}:30000"], "labels": {
            "stack": "sim", "role": f"{group}-r{rank}", "group": group, "mode": group[:-2],
            "rank": str(rank), "node": f"10.231.60.{n}"}}
        for group, nodes in (("prefill-a", (1, 2)), ("prefill-b", (3, 4)),
                             ("decode-a", (5, 6)), ("decode-b", (7, 8)))
        for rank, n in enumerate(nodes)] + [
        {"targets": ["10.231.60.5:29000"],
         "labels": {"stack": "sim", "role": "router", "node": "10.231.60.5"}}]
    after, _ = run_observability(observability_values(), serving_outputs(two_by_two))
    old = {r.name: r.inputs for r in before.resources}
    new = {r.name: r.inputs for r in after.resources}
    assert set(old) == set(new)
    changed = {name for name in old if old[name] != new[name]}
    assert changed == {"prometheus-targets"}, changed


def test_a_rule_change_replaces_prometheus_only() -> None:
    before, _ = run_observability(observability_values(), serving_outputs())
    values = observability_values()
    values["alerts"]["rankDownForSeconds"] = 10
    after, _ = run_observability(values, serving_outputs())
    old = {r.name: r.inputs for r in before.resources}
    new = {r.name: r.inputs for r in after.resources}
    assert {name for name in old if old[name] != new[name]} == {"prometheus-rules", "prometheus"}


def test_the_ssh_key_is_a_secret_and_appears_nowhere_in_plain_text() -> None:
    run, _ = run_observability(observability_values(), serving_outputs())
    for resource in run.resources:
        assert PRIVATE_KEY not in json.dumps(resource.inputs), resource.name
    directories = run.named("observability-directories")
    assert "4dabf18193072939515e22adb298388d" in json.dumps(directories.raw_inputs)  # secret sig


def test_the_key_in_plain_text_is_refused_before_anything() -> None:
    message, run = run_observability_refused(observability_values(), serving_outputs(),
                                             private_key_secret=False)
    assert "sshPrivateKey: set in plain text (value not shown)" in message
    assert "pulumi config set --secret sshPrivateKey" in message
    assert PRIVATE_KEY not in message and run.resources == []


@pytest.mark.parametrize(("change", "expected"), [
    ({"prometheus": {"image": "prom/prometheus:v2.53.0"}},
     "prometheus.image: 'prom/prometheus:v2.53.0' is not pinned by digest"),
    ({"alertmanager": {"image": "prom/alertmanager@sha256:" + "a" * 64,
                       "receiverUrl": "hooks.example/alerts"}},
     "alertmanager.receiverUrl: 'hooks.example/alerts' is not an http(s) URL"),
    ({"servingStack": "sim"}, "servingStack: 'sim' is not a fully qualified stack name"),
    ({"alertz": {}}, "alertz: unknown key (value {}), so the program would never read it (did you mean "
                     "'alerts'?)"),
])
def test_bad_config_is_refused_naming_key_value_and_fix(change: dict, expected: str) -> None:
    values = observability_values(**change)
    message, run = run_observability_refused(values, serving_outputs())
    assert expected in message, message
    assert run.resources == []


def test_a_serving_stack_without_metrics_is_refused_saying_what_to_set() -> None:
    message, run = run_observability_refused(observability_values(),
                                             serving_outputs(targets=[]))
    assert "servingStack: 'organization/kimipd/sim' lists no prometheusTargets" in message
    assert "pulumi config set --path metrics.enabled true" in message
    assert not run.of_type(CONTAINER) and not run.of_type(COMMAND)


def test_a_port_a_serving_process_holds_on_the_node_is_refused() -> None:
    values = observability_values()
    values["prometheus"]["port"] = 30000
    message, run = run_observability_refused(values, serving_outputs())
    assert "prometheus.port: 30000 on node 10.231.60.4 is a serving stack target's port" in message
    assert not run.of_type(CONTAINER)


def test_a_prometheus_node_the_serving_firewall_refuses_is_refused() -> None:
    values = observability_values()
    values["node"] = {**values["node"], "address": "10.231.60.9",
                      "hostKey": values["node"]["hostKey"]}
    message, run = run_observability_refused(values, serving_outputs())
    assert ("node.address: 10.231.60.9 is neither a node of the serving stack "
            "'organization/kimipd/sim' nor in its firewall.monitoringHosts") in message
    assert "pulumi config set --path 'kimipd:firewall.monitoringHosts[0]' 10.231.60.9 -s sim" \
        in message
    assert not run.of_type(CONTAINER)
    # A monitoring host, a network of them, or a serving stack without a firewall: accepted.
    for firewall in ({"monitoringHosts": ["10.231.60.9"]}, {"operatorHosts": ["10.231.60.0/24"]},
                     {"enabled": False}):
        outputs = serving_outputs()
        outputs["firewall"] = outputs["firewall"] | firewall
        assert run_observability(values, outputs)[0].of_type(CONTAINER), firewall
