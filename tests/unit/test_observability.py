"""The observability project's model, its reading of the serving stack and its renderings, as
pure functions; its rules under Prometheus's own rule tester (promtool test rules)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.config import ConfigError, VerificationSpec
from observability.config import AlertsSpec, load_observability_config
from observability.host_key import resolve_host_key
from observability.render import (
    alertmanager_plan,
    alertmanager_yaml,
    prometheus_plan,
    prometheus_yaml,
    targets_json,
    write_file_command,
)
from observability.rules import RULES_FILE, rules_document, rules_yaml
from observability.serving import serving_stack, ttft_ceiling, ttft_threshold
from tests.conftest import REPO
from tests.program.observability_harness import observability_values, serving_outputs
from tests.outputs import complete_outputs

RULE_TESTS = REPO / "observability" / "rule-tests"


def promtool() -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: scripts/test installs Debian's prometheus package"
    return binary


@pytest.fixture
def rendered_rules(tmp_path: Path) -> Path:
    """The rules as the rule tests expect them: the default `for`s, a 2.5 s TTFT ceiling."""
    (tmp_path / RULES_FILE).write_text(rules_yaml(AlertsSpec(), 2.5, "alerts.ttftSeconds"))
    for test in RULE_TESTS.glob("*.test.yml"):
        shutil.copy(test, tmp_path / test.name)
    return tmp_path


def test_every_rule_test_passes_under_promtool(rendered_rules: Path) -> None:
    tests = sorted(path.name for path in rendered_rules.glob("*.test.yml"))
    result = subprocess.run([promtool(), "test", "rules", *tests], cwd=rendered_rules,
                            capture_output=True, text=True, timeout=120, check=False)
    print(result.stdout)
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}{result.stderr}"


def test_every_alert_has_a_rule_test() -> None:
    alerts = {rule["alert"] for group in rules_document(AlertsSpec(), 2.5, "x")["groups"]
              for rule in group["rules"] if "alert" in rule}
    tested = {name for path in RULE_TESTS.glob("*.test.yml")
              for name in re.findall(r"alertname: (\w+)", path.read_text())}
    assert alerts - tested == set(), f"alerts without a promtool test: {alerts - tested}"


def test_the_rules_and_config_pass_promtool_check(tmp_path: Path) -> None:
    cfg = load_observability_config(observability_values())
    (tmp_path / RULES_FILE).write_text(rules_yaml(cfg.alerts, 5, "alerts.ttftSeconds"))
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "kimipd.json").write_text(targets_json(
        serving_outputs()["prometheusTargets"]))
    # The container sees its files under /etc/prometheus; here they are in tmp_path.
    config = prometheus_yaml(cfg, "organization/kimipd/sim").replace("/etc/prometheus",
                                                                     str(tmp_path))
    (tmp_path / "prometheus.yml").write_text(config)
    result = subprocess.run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_sim_stack_file_loads_once_its_images_are_set() -> None:
    cfg = load_observability_config(observability_values())
    assert cfg.serving_stack == "organization/kimipd/sim"
    assert cfg.node.address == "10.231.60.4"
    assert cfg.alerts.rank_down_for_seconds == 4


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("prometheus.image", "prom/prometheus:v2.53.0",
     "prometheus.image: 'prom/prometheus:v2.53.0' is not pinned by digest, so each node's pull "
     "may run another build; pin it: `docker buildx imagetools inspect prom/prometheus:v2.53.0`"),
    ("alertmanager.image", "Prom/Alertmanager@sha256:" + "a" * 64,
     "alertmanager.image: 'Prom/Alertmanager@sha256:" + "a" * 64 + "' has upper-case letters"),
    ("alertmanager.receiverUrl", "ftp://x/y",
     "alertmanager.receiverUrl: 'ftp://x/y' is not an http(s) URL; write the webhook receiver's "
     "full URL"),
    ("alertmanager.port", 9090,
     "alertmanager.port: 9090 is prometheus.port too, and both run with host networking on "
     "10.231.60.4: give them different ports"),
    ("node.address", "obs-node", "node.address: 'obs-node' is not an IPv4 address"),
    ("directory", "var/lib/obs", "directory: 'var/lib/obs' is not an absolute path"),
    ("alerts.ttftQuantile", 1.5, "alerts.ttftQuantile: 1.5 is not below 1.0; set it below 1.0."),
    ("alerts.rankDownFor", 5, "alerts.rankDownFor: unknown key (value 5), so the program would "
                              "never read it (did you mean 'rankDownForSeconds'?)"),
    ("prometheus.scrapeIntervalSeconds", "2s",
     "prometheus.scrapeIntervalSeconds: '2s' is not a whole number"),
    ("alertmanager.receiverUrl", 26,
     "alertmanager.receiverUrl: 26 is a number, not a string: put it in quotes, \"26\"; from the "
     "CLI: pulumi config set --path --type string kimipd-observability:alertmanager.receiverUrl 26."),
])
def test_bad_values_are_refused_naming_key_value_and_fix(key: str, value: object,
                                                         expected: str) -> None:
    values = observability_values()
    *path, last = key.split(".")
    section = values
    for part in path:
        section = section[part]
    section[last] = value
    with pytest.raises(ConfigError) as refused:
        load_observability_config(values)
    assert expected in str(refused.value), str(refused.value)


def test_the_serving_stack_must_be_deployed_with_metrics() -> None:
    with pytest.raises(ConfigError, match="has no outputs: it was never deployed"):
        serving_stack("organization/kimipd/nope", {})
    with pytest.raises(ConfigError, match=r"no prometheusTargets output \(its kimipd:serving is "
                                          r"false\)"):
        serving_stack("organization/kimipd/sim", complete_outputs({"serving": False}))
    with pytest.raises(ConfigError, match=r"'organization/kimipd/sim': the stack's outputs are of "
                                          r"version None.*`pulumi up` it with this checkout"):
        serving_stack("organization/kimipd/sim", {"serving": False})
    with pytest.raises(ConfigError, match="metrics.enabled is false"):
        serving_stack("organization/kimipd/sim", serving_outputs(targets=[]))


def test_the_ttft_ceiling_comes_from_the_verification_baseline() -> None:
    baseline = VerificationSpec.model_validate({"tolerance": 0.1, "baseline": [
        {"name": "warmup", "inputTokens": 6, "outputTokens": 16},
        {"name": "medium", "inputTokens": 1680, "outputTokens": 512,
         "minPrefillTokensPerSecond": 2000},
        {"name": "long", "inputTokens": 5280, "outputTokens": 256,
         "minPrefillTokensPerSecond": 4000}]})
    # 1680 / (2000 x 0.9) = 0.933 s; 5280 / (4000 x 0.9) = 1.467 s: the largest allowed.
    assert ttft_ceiling(baseline) == (1.467, "verification.baseline long: 5280 tokens at 4000 "
                                             "tok/s -10%")
    assert ttft_ceiling(VerificationSpec()) is None
    # pro6000's runbook figures: 5280 / (112 x 0.9) = 52.4 s, but its e2e is 13.0 s (+10%).
    pro6000 = VerificationSpec.model_validate(
        yaml.safe_load((REPO / "Pulumi.pro6000.yaml").read_text())["config"]["kimipd:verification"])
    assert ttft_ceiling(pro6000) == (14.3, "verification.baseline long: 5280 tokens at 112 tok/s "
                                           "-10%, capped by its maxE2eSeconds 13 +10%")
    outputs = serving_outputs(verification=baseline.model_dump(by_alias=True, mode="json"))
    derived = load_observability_config(observability_values(alerts={}))
    assert ttft_threshold(derived, serving_stack("organization/kimipd/sim", outputs))[0] == 1.467
    explicit = load_observability_config(observability_values())
    assert ttft_threshold(explicit, serving_stack("organization/kimipd/sim", outputs)) == (
        5, "alerts.ttftSeconds")


def test_no_ttft_ceiling_anywhere_is_refused_saying_where_to_set_one() -> None:
    cfg = load_observability_config(observability_values(alerts={}))
    with pytest.raises(ConfigError) as refused:
        ttft_threshold(cfg, serving_stack("organization/kimipd/sim", serving_outputs()))
    message = str(refused.value)
    assert "alerts.ttftSeconds: not set, and serving stack 'organization/kimipd/sim' has no " \
           "verification baseline with a minPrefillTokensPerSecond" in message
    assert "pulumi config set --path kimipd-observability:alerts.ttftSeconds" in message


def test_prometheus_reads_the_targets_file_the_stack_writes() -> None:
    cfg = load_observability_config(observability_values())
    document = yaml.safe_load(prometheus_yaml(cfg, "organization/kimipd/sim"))
    kimipd = document["scrape_configs"][0]
    assert kimipd["job_name"] == "kimipd"
    assert kimipd["file_sd_configs"][0]["files"] == ["/etc/prometheus/targets/kimipd.json"]
    assert document["global"]["scrape_interval"] == "2s"
    assert document["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "10.231.60.4:9093"]
    targets = serving_outputs()["prometheusTargets"]
    assert json.loads(targets_json(targets)) == targets
    assert targets_json(targets) == targets_json(json.loads(targets_json(targets)))


def test_alertmanager_sends_every_alert_to_the_webhook() -> None:
    cfg = load_observability_config(observability_values())
    document = yaml.safe_load(alertmanager_yaml(cfg))
    assert document["route"]["receiver"] == "kimipd-webhook"
    assert document["route"]["group_wait"] == "0s"
    assert document["receivers"][0]["webhook_configs"] == [
        {"url": "http://10.231.60.254:18093/kimipd-alerts", "send_resolved": True}]
    inhibited = {(rule["source_matchers"][0], tuple(rule["target_matchers"]),
                  tuple(rule["equal"])) for rule in document["inhibit_rules"]}
    assert inhibited == {
        ("alertname=KimipdGroupRankDown", ("alertname=KimipdTargetDown",), ("stack", "group")),
        ("alertname=KimipdMooncakeMasterDown", ("alertname=KimipdTargetDown",), ("stack", "role")),
        # A slot router's own target-down is its slot down at the door, both down none up.
        ("alertname=KimipdDoorSlotDown", ("alertname=KimipdTargetDown", "role=router"),
         ("stack", "slot")),
        ("alertname=KimipdDoorNoSlotUp", ("alertname=KimipdDoorSlotDown",), ("stack",)),
        # The door down: the slots' states are unknown, its own target says nothing more.
        ("alertname=KimipdDoorDown", ("alertname=~KimipdDoorSlotDown|KimipdDoorNoSlotUp",),
         ("stack",)),
        ("alertname=KimipdDoorDown", ("alertname=KimipdTargetDown", "role=door"), ("stack",)),
        # One of two doors down: a lost spare, its own target says nothing more.
        ("alertname=KimipdDoorSpareDown", ("alertname=KimipdTargetDown", "role=door"),
         ("stack", "node")),
        # A lost node's targets are all down; the node's alert says it once.
        ("alertname=KimipdNodeLost", ("alertname=~KimipdTargetDown|KimipdDoorSpareDown",),
         ("stack", "node"))}


def test_alertmanager_accepts_its_config(tmp_path: Path) -> None:
    amtool = shutil.which("amtool")
    assert amtool, "amtool is missing: scripts/test installs Debian's prometheus-alertmanager"
    cfg = load_observability_config(observability_values())
    (tmp_path / "alertmanager.yml").write_text(alertmanager_yaml(cfg))
    result = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_containers_command_lines() -> None:
    cfg = load_observability_config(observability_values())
    assert prometheus_plan(cfg).command == [
        "--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
        "--storage.tsdb.retention.time=2d", "--web.listen-address=:9090",
        "--web.external-url=http://10.231.60.4:9090"]
    assert alertmanager_plan(cfg).command == [
        "--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager",
        "--web.listen-address=:9093", "--cluster.listen-address=",
        "--web.external-url=http://10.231.60.4:9093"]
    assert prometheus_plan(cfg).mounts == [
        ("/var/lib/kimipd-sim/observability/prometheus/etc", "/etc/prometheus", True),
        ("/var/lib/kimipd-sim/observability/prometheus/data", "/prometheus", False)]


def test_files_are_written_whole_then_renamed(tmp_path: Path) -> None:
    target = tmp_path / "targets" / "kimipd.json"
    target.parent.mkdir()
    command = write_file_command(str(target))
    subprocess.run(["bash", "-c", command], input="[1]\n", text=True, check=True)
    assert target.read_text() == "[1]\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["kimipd.json"]


def test_the_node_key_comes_from_known_hosts_and_a_node_missing_there_is_refused(
        tmp_path: Path) -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOFx" + "A" * 40
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"10.231.60.4 {key}\n")
    values = observability_values()
    del values["node"]["hostKey"]
    values["connection"]["knownHostsFile"] = str(known_hosts)
    assert resolve_host_key(load_observability_config(values)) == key
    known_hosts.write_text(f"10.231.60.5 {key}\n")
    with pytest.raises(ConfigError, match=r"node: '10.231.60.4' has no key in "
                                          r"connection.knownHostsFile .*ssh-keyscan -t ed25519 "
                                          r"10.231.60.4"):
        resolve_host_key(load_observability_config(values))
    values["connection"]["knownHostsFile"] = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="connection.knownHostsFile: .* does not exist"):
        resolve_host_key(load_observability_config(values))
