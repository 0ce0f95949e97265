"""Pure renderers: the typed model in, the exact argv / environment / shell line out.

Nothing here imports Pulumi. What these functions return is what `pulumi preview --diff` shows
and what runs on a node, so a reviewer reads these files to see exactly what will run. Flags
target SGLang 0.5.19 (`python/sglang/srt/server_args.py`) and sglang-router 0.3.2. One module per
thing rendered: `sglang.py`, `router.py` (and the smoke test), `mooncake_master.py`,
`node_scripts.py` (preflight, gates, image check), `node_files.py` (launch.sh's installs, the
prepared image), `prometheus.py`, `firewall.py` (each node's nftables table), `keepalived.py`
(the door's virtual IP on two nodes);
`container_plan.py` is what docker is told about any container,
`layout.py` where things live on a node and `roles.py` every container role a config defines.
"""

from .container_plan import ContainerPlan, container_labels, container_mounts, env_list
from .door import (DOOR, door_admin_socket, door_bridge_command, door_bridge_retire_command,
                   door_ca_file, door_haproxy_config, door_plan, door_spec, door_url,
                   remove_door_files_command, slot_role, slot_server, slot_url,
                   write_door_config_command, write_door_tls_command)
from .firewall import (firewall_apply_command, firewall_remove_command, firewall_ruleset,
                       firewall_table)
from .keepalived import (door_check_file, keepalived_config, keepalived_config_file,
                         keepalived_plan, keepalived_state_file, remove_virtual_ip_files_command,
                         virtual_ip_dir, virtual_ip_spec, write_keepalived_config_command)
from .layout import MOONCAKE_MASTER, NODE_ASSET_DIR, NODE_SCRIPTS, ROUTER, rank_role
from .roles import container_roles
from .membership import (admit_command, drain_command, restore_command, router_ready_command,
                         slot_admit_command, slot_door_admit_command, slot_door_drain_command,
                         slot_drain_command, slot_unwant_command,
                         slot_want_command, unwant_command, want_command)
from .mooncake_master import mooncake_master_address, mooncake_master_command, mooncake_master_plan
from .node_files import (prepare_dirs_command, prepare_image_command, prepared_image_id,
                         prepared_image_tag)
from .node_scripts import (bootstrap_url, connection_ssh_opts, docker_ssh_opts,
                           image_env_check_command, preflight_command, wait_bootstrap_command,
                           wait_healthy_command)
from .prometheus import prometheus_targets
from .router import (router_api_key_file, router_auth_header_file, router_command, router_plan,
                     router_slots, router_url,
                     smoke_test_command, smoke_test_text, write_api_key_command)
from .sglang import (group_endpoint, remove_worker_key_command, sglang_command, sglang_env,
                     sglang_launch_args, sglang_rank_plan, variables_set_in_every_container,
                     worker_key_file, worker_key_yaml, write_worker_key_command)

__all__ = [
    "container_roles",
    "DOOR",
    "door_admin_socket",
    "door_bridge_command",
    "door_bridge_retire_command",
    "door_ca_file",
    "door_haproxy_config",
    "door_plan",
    "door_spec",
    "door_url",
    "remove_door_files_command",
    "router_slots",
    "slot_admit_command",
    "slot_door_admit_command",
    "slot_door_drain_command",
    "slot_drain_command",
    "slot_role",
    "slot_server",
    "slot_unwant_command",
    "slot_url",
    "slot_want_command",
    "write_door_config_command",
    "write_door_tls_command",
    "MOONCAKE_MASTER",
    "NODE_ASSET_DIR",
    "NODE_SCRIPTS",
    "ROUTER",
    "ContainerPlan",
    "admit_command",
    "drain_command",
    "restore_command",
    "router_api_key_file",
    "router_auth_header_file",
    "router_ready_command",
    "unwant_command",
    "want_command",
    "write_api_key_command",
    "bootstrap_url",
    "container_labels",
    "container_mounts",
    "connection_ssh_opts",
    "docker_ssh_opts",
    "env_list",
    "firewall_apply_command",
    "firewall_remove_command",
    "firewall_ruleset",
    "firewall_table",
    "door_check_file",
    "keepalived_config",
    "keepalived_config_file",
    "keepalived_plan",
    "keepalived_state_file",
    "remove_virtual_ip_files_command",
    "virtual_ip_dir",
    "virtual_ip_spec",
    "write_keepalived_config_command",
    "group_endpoint",
    "image_env_check_command",
    "mooncake_master_address",
    "mooncake_master_command",
    "mooncake_master_plan",
    "preflight_command",
    "prepare_dirs_command",
    "prepare_image_command",
    "prepared_image_id",
    "prepared_image_tag",
    "prometheus_targets",
    "rank_role",
    "router_command",
    "router_plan",
    "router_url",
    "sglang_command",
    "sglang_env",
    "sglang_launch_args",
    "sglang_rank_plan",
    "smoke_test_command",
    "smoke_test_text",
    "variables_set_in_every_container",
    "wait_bootstrap_command",
    "wait_healthy_command",
    "remove_worker_key_command",
    "worker_key_file",
    "worker_key_yaml",
    "write_worker_key_command",
]
