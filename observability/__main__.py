"""Prometheus and Alertmanager for a kimipd serving stack, read through StackReference."""

import sys
from pathlib import Path

# The serving project's packages (components/) sit beside this directory.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi  # noqa: E402
from pulumi.runtime.sync_await import _sync_await  # noqa: E402

from components.config import ConfigError  # noqa: E402
from components.stack_config import (  # noqa: E402
    check_stack_secrets,
    ssh_private_key,
    stack_config_values,
    stack_config_warnings,
)
from observability.config import (  # noqa: E402
    CONFIG_NAMESPACE,
    SECRET_KEYS,
    ObservabilityConfig,
    load_observability_config,
)
from observability.host_key import resolve_host_key  # noqa: E402
from observability.monitoring import Monitoring  # noqa: E402
from observability.serving import (  # noqa: E402
    TARGETS_OUTPUT,
    check_against_serving,
    serving_stack,
    ttft_threshold,
)

for warning in stack_config_warnings(CONFIG_NAMESPACE):
    pulumi.log.warn(warning)
# Everything is checked before the first resource is registered (the StackReference only reads).
try:
    check_stack_secrets(CONFIG_NAMESPACE, ObservabilityConfig, SECRET_KEYS)
    config = load_observability_config(stack_config_values(CONFIG_NAMESPACE, SECRET_KEYS))
    host_key = resolve_host_key(config)
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None

reference = pulumi.StackReference(config.serving_stack)
try:
    # Read now, as plain data: the checks below, and the renderings, need the values before any
    # resource is registered. Reading them is no change to anything.
    outputs = _sync_await(reference.outputs.future()) or {}
except Exception as error:  # the engine's own message says why (no such stack, no backend)
    raise pulumi.RunError(
        f"invalid {CONFIG_NAMESPACE} stack configuration:\n  servingStack: "
        f"{config.serving_stack!r} cannot be read ({error}); name a deployed stack of the "
        "serving project on this backend, ORGANIZATION/kimipd/STACK (`pulumi stack ls` in the "
        "serving project).") from None
try:
    serving = serving_stack(config.serving_stack, outputs)
    check_against_serving(config, serving)
    ttft = ttft_threshold(config, serving)
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None

monitoring = Monitoring("observability", config, serving, ttft,
                        ssh_private_key(CONFIG_NAMESPACE), host_key)
pulumi.export("prometheusUrl", monitoring.prometheus_url)
pulumi.export("alertmanagerUrl", monitoring.alertmanager_url)
pulumi.export("servingStack", config.serving_stack)
pulumi.export("targets", len(serving.addresses))
pulumi.export("ttftAlertSeconds", {"seconds": ttft[0], "from": ttft[1]})
pulumi.export(f"{TARGETS_OUTPUT}File", "/etc/prometheus/targets/kimipd.json")
