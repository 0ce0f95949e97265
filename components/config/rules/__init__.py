"""Cross-field rules: each takes the whole ClusterConfig and yields one message per problem.

A message names the key, the value, the reason and the fix. RULES is the order the messages
are reported in (the model validator of ClusterConfig runs them all and reports every problem).
"""

from .door import client_keys_need_the_rust_router, door_nodes_are_members, virtual_ip_is_free
from .extra_args import extra_args_parse, tokenizer_workers_with_keys
from .files import model_reachable, mount_points_distinct, node_files_distinct
from .firewall import open_ports_serve_nothing
from .gates import gate_polls_twice
from .kv_contract import prefill_and_decode_agree
from .ports import ports_do_not_collide
from .router import router_policy, rust_only_keys
from .runbook import (
                      compute_network_only,
                      mooncake_new_enough,
                      no_expandable_segments,
                      no_nixl,
                      restart_only_by_the_program,
)
from .topology import (
                      both_modes_present,
                      duplicate_nodes,
                      gpus_per_node,
                      group_names,
                      group_shape,
                      groups_share_no_node_per_mode,
                      out_nodes_keep_the_cluster_serving,
                      unknown_nodes,
)

RULES = (
    unknown_nodes,
    duplicate_nodes,
    group_names,
    group_shape,
    groups_share_no_node_per_mode,
    gpus_per_node,
    both_modes_present,
    out_nodes_keep_the_cluster_serving,
    model_reachable,
    mount_points_distinct,
    restart_only_by_the_program,
    no_expandable_segments,
    compute_network_only,
    no_nixl,
    extra_args_parse,
    prefill_and_decode_agree,
    tokenizer_workers_with_keys,
    mooncake_new_enough,
    router_policy,
    rust_only_keys,
    door_nodes_are_members,
    virtual_ip_is_free,
    client_keys_need_the_rust_router,
    ports_do_not_collide,
    node_files_distinct,
    gate_polls_twice,
    open_ports_serve_nothing,
)
