"""extraArgs against the real SGLang and router option tables, and the flags the program owns."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


from ...cli_spec import CliTable, router_table, sglang_table

# Flags the program renders from the model. Given again in extraArgs, argparse keeps the last
# occurrence, so the cluster would run something other than what config, preview and the stack
# outputs say. dest -> the key that sets it ({group} is the group's key prefix).
MANAGED_SGLANG_FLAGS = {
    "model_path": "model.path",
    "served_model_name": "model.servedModelName",
    "disaggregation_mode": "{group}.mode",
    "disaggregation_transfer_backend": "{group}.transferBackend",
    "disaggregation_bootstrap_port": "{group}.bootstrapPort",
    "disaggregation_ib_device": "network.rdmaDevices",
    "tp_size": "{group}.tpSize",
    "ep_size": "{group}.epSize",
    "nnodes": "{group}.nodes",
    "node_rank": "{group}.nodes (rank order)",
    "dist_init_addr": "{group}.distInitPort (the host is the group's first node)",
    "host": "nothing: every rank binds 0.0.0.0 so decode reaches prefill's bootstrap server",
    "port": "{group}.httpPort",
    "enable_metrics": "metrics.enabled (it also lists the targets in prometheusTargets)",
    "api_key": "the secret routerApiKey with router.kind rust (it reaches the servers in a "
               "root-only file, never on a command line)",
    "admin_api_key": "the secret adminApiKey (it reaches the servers in their root-only key "
                     "file, never on a command line)",
    "config": "nothing: the program passes its own key file with --config; put options in "
              "{group}.extraArgs",
}
MANAGED_ROUTER_FLAGS = {
    "pd_disaggregation": "nothing: the router always runs in PD mode",
    "mini_lb": "router.kind",
    "policy": "router.policy",
    "prefill_policy": "router.prefillPolicy",
    "decode_policy": "router.decodePolicy",
    "prometheus_port": "router.metricsPort",
    "prometheus_host": "nothing: the router's metrics listen on every address of its node",
    "request_timeout_secs": "router.requestTimeoutSeconds",
    "retry_max_retries": "router.retryMaxRetries",
    "health_check_interval_secs": "router.healthCheckIntervalSeconds",
    "health_failure_threshold": "router.healthFailureThreshold",
    "health_check_timeout_secs": "router.healthCheckTimeoutSeconds",
    "cb_timeout_duration_secs": "router.circuitBreakerTimeoutSeconds",
    "api_key": "the secret routerApiKey (never on a command line)",
    "shutdown_grace_period_secs": "router.drainTimeoutSeconds",
    "prefill": "groups (every prefill group is passed with its bootstrap port)",
    "decode": "groups (every decode group is passed)",
    "host": "router.host",
    "port": "router.port",
}


def _extra_args_problems(key: str, args: list[str], table: CliTable,
                         managed: Mapping[str, str]) -> Iterable[str]:
    complaint = table.check(args)
    if complaint is not None:
        yield (f"{key}: {args!r} is refused by {table.label}'s own parser ({complaint}); fix "
               f"the flag or its value (the launch would exit with status 2 on the node).")
    for occurrence in table.occurrences(args):
        setter = managed.get(occurrence.option.dest)
        if setter is not None:
            canonical = occurrence.option.options[0]
            yield (f"{key}[{occurrence.index}]: {occurrence.written!r} sets {canonical}, which "
                   f"the program renders itself (the last occurrence wins, so the cluster would "
                   f"run something other than config, preview and outputs say); remove it and "
                   f"set {setter}.")


def extra_args_parse(cfg: ClusterConfig) -> Iterable[str]:
    for name, group in cfg.groups.items():
        managed = {dest: setter.format(group=f"groups.{name}")
                   for dest, setter in MANAGED_SGLANG_FLAGS.items()}
        yield from _extra_args_problems(f"groups.{name}.extraArgs", group.extra_args,
                                        sglang_table(), managed)
    yield from _extra_args_problems("router.extraArgs", cfg.router.extra_args,
                                    router_table(cfg.router.kind), MANAGED_ROUTER_FLAGS)


def tokenizer_workers_with_keys(cfg: ClusterConfig) -> Iterable[str]:
    """SGLang 0.5.19 asserts that no key is set with more than one tokenizer worker (its key
    middleware is installed only with one), so such a group would not start."""
    if not cfg.workers_keyed:
        return
    table = sglang_table()
    for name, group in cfg.groups.items():
        args = group.extra_args
        for occurrence in table.occurrences(args):
            if occurrence.option.dest != "tokenizer_worker_num":
                continue
            value = occurrence.value(args)
            if value is not None and value.strip() != "1":
                yield (f"groups.{name}.extraArgs[{occurrence.index}]: {occurrence.written!r} "
                       f"{value!r} runs several tokenizer workers, and SGLang refuses an API key "
                       "with more than one (router.kind 'rust' keys every server with "
                       "routerApiKey): remove it, or use --tokenizer-worker-num 1.")
