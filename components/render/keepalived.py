"""The door's virtual IP: keepalived's configuration for one of the two door nodes.

keepalived 2.2.7 (Debian 12's package) speaks VRRPv3 by unicast to the other door node alone;
both start as BACKUP with `nopreempt`, so a node whose link or door comes back does not take the
address from the one serving (a partition that kept the link up ends with two masters, which
VRRP settles by priority). The local door's health arrives through a track file that a check
loop beside keepalived writes every interval (`vrrp_script` runs at most once a second, and
`vrrp_track_process` needs the host's network namespace): 0 is healthy, anything else puts the
instance in FAULT, which gives the address up at once. Priority cannot do it: with `nopreempt`
a backup never takes over from a master of lower priority.

VRRPv3 has no authentication (VRRPv2's password travels in clear). What keeps a stranger from
moving the address is each door node's nftables table, which accepts VRRP from the other door
node only (firewall.py); `check_unicast_src` is keepalived's own second check.
docs/vrrp-trial.md has the figures behind each choice.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from ..config import ClusterConfig
from ..config.router_schema import VirtualIpSpec
from .container_plan import ContainerPlan, container_plan
from .door import door_spec
from .firewall import firewall_table
from .layout import NODE_ASSET_DIR, VIRTUAL_IP_SCRIPT, container_name, router_state_dir, shell

KEEPALIVED = "keepalived"
# To add and remove the address and send gratuitous ARP (NET_ADMIN), and to speak VRRP, IP
# protocol 112, on a raw socket (NET_RAW, NET_BROADCAST); nothing else of root's.
KEEPALIVED_CAPABILITIES = ["NET_ADMIN", "NET_RAW", "NET_BROADCAST"]
# Long enough for keepalived's priority-0 advert on SIGTERM (the trial's graceful stop moved
# the address in 0.06-0.08 s).
KEEPALIVED_STOP_GRACE_SECONDS = 10

# The instance's name in keepalived's log and state; one per door (one router port per node).
INSTANCE = "door"
# Only decides the first election when both start together (and which master stays when a
# partition heals); afterwards `nopreempt` keeps the address where it is.
ROUTER_NODE_PRIORITY = 150
OTHER_NODE_PRIORITY = 100


def virtual_ip_spec(cfg: ClusterConfig) -> VirtualIpSpec:
    door = cfg.router.door
    if door is None or door.virtual_ip is None:
        raise ValueError("router.door.virtualIp is not set")
    return door.virtual_ip


def virtual_ip_dir(cfg: ClusterConfig | int) -> str:
    """keepalived's directory on each door node: its configuration and the door's check file.
    CFG or router.port."""
    return f"{router_state_dir(cfg)}/vip"


def keepalived_config_file(cfg: ClusterConfig) -> str:
    return f"{virtual_ip_dir(cfg)}/keepalived.conf"


def door_check_file(cfg: ClusterConfig) -> str:
    """What the check loop writes: 0 while the local door answers /health, 1 otherwise."""
    return f"{virtual_ip_dir(cfg)}/door-down"


def keepalived_state_file(cfg: ClusterConfig) -> str:
    """What the notify FIFO's reader writes at every change of the instance's state (MASTER,
    BACKUP, FAULT, STOP): what `kimipd status` reads on each door node."""
    return f"{virtual_ip_dir(cfg)}/state"


def keepalived_notify_fifo(cfg: ClusterConfig) -> str:
    """Where keepalived writes its transitions, in order (it creates the FIFO and starts the
    reader, assets/virtual-ip.sh --notify-fifo, with the FIFO's path as its last argument)."""
    return f"{virtual_ip_dir(cfg)}/notify.fifo"


def virtual_ip_interface(cfg: ClusterConfig) -> str:
    return virtual_ip_spec(cfg).interface or cfg.network.compute_interface


def advert_interval(milliseconds: int) -> str:
    """keepalived's `advert_int`, in seconds: 100 -> 0.1, 1000 -> 1."""
    seconds = Decimal(milliseconds) / 1000
    return format(seconds.normalize(), "f")


def keepalived_config(cfg: ClusterConfig, address: str) -> str:
    """keepalived.conf for the door node ADDRESS."""
    vip = virtual_ip_spec(cfg)
    peer = cfg.door_peer(address)
    if peer is None:
        raise ValueError(f"{address} is not one of router.door.nodes {cfg.door_nodes}")
    interface = virtual_ip_interface(cfg)
    priority = ROUTER_NODE_PRIORITY if address == cfg.router.node else OTHER_NODE_PRIORITY
    state_file = keepalived_state_file(cfg)
    return f"""\
# kimipd: the door's virtual IP {vip.address} on {address}; the other door node is {peer}.
# No VRRP authentication (VRRPv3 has none): the nftables table inet {firewall_table(cfg)}
# accepts VRRP from {peer} only, and check_unicast_src refuses any other source.
global_defs {{
    router_id kimipd-door-{address}
    vrrp_version 3
    # The FIFO's reader runs as root, as keepalived does in its container: without
    # script_user it wants a user keepalived_script the image lacks, and without script
    # security `keepalived -t` refuses any script (2.2.7: "SECURITY VIOLATION", exit 6).
    script_user root
    enable_script_security
    # Each new state of the instance into a file `kimipd status` reads (keepalived has no query
    # interface), through a FIFO that keeps their order (notify scripts run concurrently);
    # run by bash, as the container's command is: the copied script need not be executable.
    vrrp_notify_fifo {keepalived_notify_fifo(cfg)}
    vrrp_notify_fifo_script "/bin/bash {VIRTUAL_IP_SCRIPT} --notify-fifo {state_file}"
}}

track_file door_down {{
    file "{door_check_file(cfg)}"
    weight 0
    # Down until the check loop has seen the door answer: a node without one never takes it.
    init_file 1 overwrite
}}

vrrp_instance {INSTANCE} {{
    state BACKUP
    nopreempt
    interface {interface}
    virtual_router_id {vip.vrid}
    priority {priority}
    advert_int {advert_interval(vip.advert_interval_ms)}
    unicast_src_ip {address}
    unicast_peer {{
        {peer}
    }}
    check_unicast_src
    virtual_ipaddress {{
        {vip.address}/{vip.prefix_length} dev {interface}
    }}
    track_file {{
        door_down
    }}
}}
"""


def virtual_ip_url(cfg: ClusterConfig) -> str:
    """The door's /health through the virtual IP: whichever door node holds it answers."""
    return f"http://{virtual_ip_spec(cfg).address}:{door_spec(cfg).metrics_port}/health"


def keepalived_plan(cfg: ClusterConfig, address: str) -> ContainerPlan:
    """keepalived and the door's check loop in one container on the door node ADDRESS
    (assets/virtual-ip.sh: if either ends, so does the other; it clears keepalived's state file
    as it starts, so no state of before a restart is shown). Gated on the door's /health
    through the virtual IP: some door node holds it and its door answers."""
    role = cfg.keepalived_role(address)
    command = [VIRTUAL_IP_SCRIPT, "--config", keepalived_config_file(cfg),
               "--check-file", door_check_file(cfg),
               "--state-file", keepalived_state_file(cfg),
               "--door", f"{address}:{door_spec(cfg).metrics_port}",
               "--interval", advert_interval(virtual_ip_spec(cfg).advert_interval_ms)]
    plan = container_plan(cfg, role, address, command, {}, virtual_ip_url(cfg),
                          gpu_workload=False)
    # No restart generation (as the door): replacing keepalived moves the address. Its own
    # directory read-write (the track file) and the program's scripts read-only.
    return dataclasses.replace(
        plan, name=container_name(KEEPALIVED), labels={"kimipd.role": role},
        mounts=[(NODE_ASSET_DIR, NODE_ASSET_DIR, True),
                (virtual_ip_dir(cfg), virtual_ip_dir(cfg), False)],
        entrypoint=["bash"], ulimits={}, capabilities=list(KEEPALIVED_CAPABILITIES),
        user="0:0")


def write_keepalived_config_command(cfg: ClusterConfig) -> str:
    """stdin (keepalived.conf) checked by the image's own `keepalived -t` (on the host's network:
    it refuses an interface the node lacks), moved into place, and a running keepalived told to
    reload (SIGHUP, which virtual-ip.sh passes on)."""
    directory, target = virtual_ip_dir(cfg), keepalived_config_file(cfg)
    new = target + ".new"
    check = ["docker", "run", "--rm", "--network", "host", "--entrypoint", KEEPALIVED,
             "-v", f"{directory}:{directory}:ro", virtual_ip_spec(cfg).image, "-t", "-f", new]
    container = shell([container_name(KEEPALIVED)])
    reload = (f"if [ \"$(docker inspect -f '{{{{.State.Running}}}}' {container} 2>/dev/null)\" = "
              f"true ]; then docker kill --signal HUP {container} >/dev/null; fi")
    return (f"mkdir -p {shell([directory])} && chmod 700 {shell([directory])} && "
            f"cat > {shell([new])} && {shell(check)} && mv {shell([new, target])} && {reload}")


def remove_virtual_ip_files_command(cfg: ClusterConfig) -> str:
    return f"rm -rf {shell([virtual_ip_dir(cfg)])}"
