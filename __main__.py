"""Kimi-K3 with SGLang prefill/decode disaggregation, KV over Mooncake RDMA."""

import gc
from pathlib import Path

import pulumi

from components import cycle_check
from components.assets import verify_node_file_sources
from components.cluster import Cluster
from components.config import (ConfigError, config_warnings, load_cluster_config,
                               out_node_notes, placeholder_refusals)
from components.host_keys import resolve_host_keys
from components.stack_config import (
    admin_api_key,
    check_stack_secrets,
    door_tls_key,
    router_api_key,
    ssh_private_key,
    stack_config_values,
    stack_config_warnings,
)

# The SDK holds every registration's futures and callbacks until the engine answers (some 700k
# objects at 64 nodes). With a young collection every 700 allocations most of them reached the
# old generation, which then grew fast enough to be rescanned whole a dozen times: a fifth of the
# program's time at 64 nodes, growing faster than the cluster. With one every 50,000 the old
# generation never grows enough during the program to be rescanned (docs/bench.md, issue 29).
# Nothing else changes: the same objects are freed.
gc.set_threshold(50_000)
# The SDK's dependency-cycle check walked everything behind each dependency it was given; this
# one walks the new resource's few dependents instead, with the same answers (on pulumi 3.272.0
# only, else the SDK's own). Before the first registration: it keeps the dependents it records.
cycle_check.install()

# Said first, so it shows even when the stack is refused (a misspelt namespace can explain a
# missing key).
for warning in stack_config_warnings():
    pulumi.log.warn(warning)
# Everything is checked before the first resource is registered: a bad stack touches nothing.
try:
    check_stack_secrets()
    config = load_cluster_config(stack_config_values())
    digests = verify_node_file_sources(config.node_files, Path.cwd())
    host_keys = resolve_host_keys(config)
    api_key = router_api_key(config)
    tls_key = door_tls_key(config)
    admin_key = admin_api_key(config)
    refused = placeholder_refusals(config, pulumi.get_stack())
    if refused:
        raise ConfigError("\n".join(refused))
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None
for warning in config_warnings(config):
    pulumi.log.warn(warning)
for note in out_node_notes(config):
    pulumi.log.warn(note)

cluster = Cluster("kimi-k3-pd", config, ssh_private_key(), digests, host_keys, api_key,
                  tls_key, admin_key)
for key, value in cluster.outputs.items():
    pulumi.export(key, value)
