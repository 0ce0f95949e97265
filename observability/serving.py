"""What the observability stack reads from the serving stack: its outputs, as plain data, checked
against this stack's own configuration before anything is touched."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from components.config import ConfigError, VerificationSpec
from components.outputs import OutputsError, read_outputs

from .config import CONFIG_NAMESPACE, ObservabilityConfig

# The serving stack's output this project scrapes (components/outputs.py).
TARGETS_OUTPUT = "prometheusTargets"


@dataclass(frozen=True)
class ServingStack:
    name: str
    # A Prometheus file_sd document: [{"targets": ["ADDRESS:PORT"], "labels": {...}}].
    targets: list[dict[str, Any]]
    verification: VerificationSpec | None
    # Who its nodes' firewalls let in ({} from a serving stack deployed before it had one).
    firewall: dict[str, Any] = field(default_factory=dict)

    def firewall_admits(self, address: str) -> bool:
        """Whether its nodes' firewalls let ADDRESS reach the metrics ports."""
        if not self.firewall.get("enabled"):
            return True
        host = ipaddress.ip_address(address)
        allowed = [*self.firewall.get("members", []), *self.firewall.get("monitoringHosts", []),
                   *self.firewall.get("operatorHosts", [])]
        return any(host in ipaddress.ip_network(entry, strict=False) for entry in allowed)

    @property
    def addresses(self) -> list[str]:
        return [address for entry in self.targets for address in entry["targets"]]

    @property
    def roles(self) -> set[str]:
        return {entry["labels"].get("role", "") for entry in self.targets}


def _problem(key: str, text: str) -> ConfigError:
    return ConfigError(f"invalid {CONFIG_NAMESPACE} stack configuration:\n  {key}: {text}")


def serving_stack(name: str, outputs: Mapping[str, Any]) -> ServingStack:
    """The serving stack NAME's outputs as this project needs them (validated by the serving
    program's own model), or a ConfigError saying what to do to the serving stack."""
    key = "servingStack"
    if not outputs:
        raise _problem(key, f"{name!r} has no outputs: it was never deployed (or was destroyed), "
                            f"or the name is wrong; deploy it first (`pulumi up -s "
                            f"{name.rsplit('/', 1)[-1]}` in the serving project), or fix the name "
                            "(`pulumi stack ls` there lists them).")
    try:
        serving = read_outputs(dict(outputs))
    except OutputsError as error:
        raise _problem(key, f"{name!r}: {error}") from None
    targets = serving.prometheus_targets
    if targets is None:
        raise _problem(key, f"{name!r} has no {TARGETS_OUTPUT} output (its kimipd:serving is "
                            "false): `pulumi up` it with kimipd:serving true first.")
    if not targets:
        raise _problem(key, f"{name!r} lists no {TARGETS_OUTPUT}: its kimipd:metrics.enabled is "
                            "false, so nothing serves /metrics; set it in the serving stack "
                            "(`pulumi config set --path metrics.enabled true`), `pulumi up` it, "
                            "then this stack.")
    try:
        verification = VerificationSpec.model_validate(serving.verification)
    except ValidationError:
        verification = None
    return ServingStack(name, list(targets), verification,
                        serving.firewall.model_dump(by_alias=True))


def ttft_ceiling(verification: VerificationSpec) -> tuple[float, str] | None:
    """The largest time to first token the verification baseline allows, as `scripts/kimipd
    verify` judges it: for each request with a minPrefillTokensPerSecond, input tokens / (that
    rate x (1 - tolerance)), and no more than its maxE2eSeconds x (1 + tolerance) (the first
    token cannot come after the last). None when no request sets a prefill rate."""
    tolerance = verification.tolerance
    allowed = []
    for request in verification.baseline:
        if not request.min_prefill_tokens_per_second:
            continue
        rate = request.min_prefill_tokens_per_second
        seconds = request.input_tokens / (rate * (1 - tolerance))
        why = (f"verification.baseline {request.name}: {request.input_tokens} tokens at "
               f"{rate:g} tok/s -{tolerance:.0%}")
        if request.max_e2e_seconds and request.max_e2e_seconds * (1 + tolerance) < seconds:
            seconds = request.max_e2e_seconds * (1 + tolerance)
            why += f", capped by its maxE2eSeconds {request.max_e2e_seconds:g} +{tolerance:.0%}"
        allowed.append((seconds, why))
    if not allowed:
        return None
    seconds, why = max(allowed)
    return round(seconds, 3), why


def ttft_threshold(cfg: ObservabilityConfig, serving: ServingStack) -> tuple[float, str]:
    """The TTFT alert's ceiling in seconds and where it comes from."""
    if cfg.alerts.ttft_seconds is not None:
        return cfg.alerts.ttft_seconds, "alerts.ttftSeconds"
    derived = ttft_ceiling(serving.verification) if serving.verification else None
    if derived is None:
        raise _problem(
            "alerts.ttftSeconds",
            f"not set, and serving stack {serving.name!r} has no verification baseline with a "
            "minPrefillTokensPerSecond to derive the time-to-first-token ceiling from: set "
            f"`pulumi config set --path {CONFIG_NAMESPACE}:alerts.ttftSeconds 2.5` here, or a "
            "baseline's minPrefillTokensPerSecond in the serving stack's kimipd:verification.")
    return derived


def check_against_serving(cfg: ObservabilityConfig, serving: ServingStack) -> None:
    """Ports this stack would take on its node that a serving process already listens on."""
    problems = []
    for key, port in (("prometheus.port", cfg.prometheus.port),
                      ("alertmanager.port", cfg.alertmanager.port)):
        address = f"{cfg.node.address}:{port}"
        if address in serving.addresses:
            problems.append(
                f"{key}: {port} on node {cfg.node.address} is a serving stack target's port "
                f"({address}, stack {serving.name!r}), and containers use host networking: pick "
                "another port or another node.")
    if not serving.firewall_admits(cfg.node.address):
        stack = serving.name.rsplit("/", 1)[-1]
        problems.append(
            f"node.address: {cfg.node.address} is neither a node of the serving stack "
            f"{serving.name!r} nor in its firewall.monitoringHosts or operatorHosts, so every "
            "node's firewall would refuse Prometheus's scrapes: add it there (`pulumi config set "
            f"--path 'kimipd:firewall.monitoringHosts[0]' {cfg.node.address} -s {stack}` in the "
            "serving project, then `pulumi up` it), or run Prometheus on one of its nodes.")
    if problems:
        raise ConfigError(f"invalid {CONFIG_NAMESPACE} stack configuration:\n  "
                          + "\n  ".join(problems))
