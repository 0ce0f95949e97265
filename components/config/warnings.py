"""Warnings: deployable, but probably not what the operator meant (`pulumi preview` shows them)."""

from __future__ import annotations

from ..cli_spec import sglang_table
from .cluster_config import ClusterConfig

FLASH_KDA_WHEEL_PREFIX = "flash_kda"
# SGLang uses flash_kda only when a linear-attention backend flag selects it (default: triton).
FLASH_KDA_FLAGS = ("linear_attn_backend", "linear_attn_prefill_backend",
                   "linear_attn_decode_backend")


def flag_values(args: list[str], dest: str) -> list[str]:
    """Every value ARGS gives the SGLang option with this dest (`--flag v` and `--flag=v`)."""
    values = []
    for occurrence in sglang_table().occurrences(args):
        if occurrence.option.dest != dest:
            continue
        if "=" in occurrence.written:
            values.append(occurrence.written.split("=", 1)[1])
        elif occurrence.index + 1 < len(args):
            values.append(args[occurrence.index + 1])
    return values


def config_warnings(cfg: ClusterConfig) -> list[str]:
    """What `pulumi preview` should say before it deploys this stack."""
    warnings = []
    shipped = [(i, f) for i, f in enumerate(cfg.node_files)
               if f.is_wheel and f.file_name.startswith(FLASH_KDA_WHEEL_PREFIX)]
    selecting = [name for name, group in cfg.groups.items()
                 if any("flashkda" in flag_values(group.extra_args, dest)
                        for dest in FLASH_KDA_FLAGS)]
    for index, node_file in shipped:
        if not selecting:
            warnings.append(
                f"nodeFiles[{index}]: {node_file.file_name!r} is installed in every container, "
                "but no group selects it, so SGLang runs its default linear-attention backend "
                "(triton); to use it add `--linear-attn-prefill-backend flashkda` (or "
                "`--linear-attn-backend flashkda`) to groups.<name>.extraArgs, or remove the "
                "wheel from nodeFiles.")
    return warnings + rollout_warnings(cfg) + exposure_warnings(cfg)


def exposure_warnings(cfg: ClusterConfig) -> list[str]:
    """What is left open to whoever reaches a node: a door without a key, servers without one,
    no firewall."""
    warnings = []
    if cfg.router.kind == "mini-lb" and cfg.serving:
        warnings.append(
            "router.kind: 'mini-lb' takes no key at the door (anyone in "
            "firewall.clientNetworks can send /generate) and forwards none, so the SGLang "
            "servers run without one: every member or operator host can call their admin routes "
            "(/flush_cache, /update_weights_from_disk, /pause_generation, ...), and no router "
            "health check or retry hides a group that is replaced or dies. Set router.kind "
            "'rust' with the secret routerApiKey (pro6000 does).")
    if not cfg.firewall.enabled:
        warnings.append(
            "firewall.enabled: false leaves every port of every node open to anyone who reaches "
            "it: SGLang's bootstrap servers (a forged PUT /route redirects decode's KV "
            "handshakes), the Mooncake master's RPC and admin ports, NCCL's and the KV "
            "transfer's run-time ports. Remove the key (default true) unless the nodes sit "
            "behind a firewall of their own.")
        door = cfg.router.door
        if door is not None and door.nodes is not None and door.virtual_ip is not None:
            warnings.append(
                f"firewall.enabled: false lets VRRP from anyone reach keepalived on "
                f"{' and '.join(door.nodes)}, and VRRPv3 has no authentication: "
                "check_unicast_src refuses a stranger's adverts, but while they came the backup "
                "took router.door.virtualIp and gave it back several times a second "
                "(docs/vrrp-trial.md). Remove the key, or drop IP protocol 112 from anyone but "
                "the two door nodes in the nodes' own firewall.")
    return warnings


def rollout_warnings(cfg: ClusterConfig) -> list[str]:
    """Where a change cannot keep serving: one group of a mode, or every group at once."""
    if cfg.router.kind != "rust" or not cfg.serving:
        return []
    warnings = []
    for mode in ("prefill", "decode"):
        groups = list(cfg.groups_in_mode(mode))
        if len(groups) == 1:
            warnings.append(
                f"groups.{groups[0]}: the only {mode} group, so a change that replaces it (image, "
                f"node files, model, restartGeneration, its own settings) leaves the router with "
                f"no "
                f"{mode} group until it has loaded again; its in-flight requests still finish "
                f"(drain). To roll changes without downtime add a second {mode} group.")
        elif cfg.rollout == "all-at-once":
            warnings.append(
                f"rollout: 'all-at-once' replaces {', '.join(groups)} together when a change "
                f"touches them all, leaving no {mode} group until they have loaded; "
                "'one-group-at-a-time' keeps one serving.")
    return warnings


def out_node_notes(cfg: ClusterConfig) -> list[str]:
    """What the preview says of each node taken out: which groups leave, that nothing on the
    node is contacted, and how its resources leave the state."""
    notes = []
    leaving = cfg.groups_leaving()
    for address in cfg.out_nodes:
        groups = sorted(name for name, nodes in leaving.items() if address in nodes)
        went = (f"{', '.join(groups)} leave{'s' if len(groups) == 1 else ''} every router "
                "slot (drained on the router's node) and "
                f"{'is' if len(groups) == 1 else 'are'} deleted, ranks on other nodes included"
                if groups else "no group runs there")
        door = cfg.router.door
        if door is not None and door.nodes is not None and address in door.nodes:
            went += (f"; its door, keepalived and router slot b go too: {cfg.router.node} "
                     "carries the door and its virtual IP alone, slot b stands in there at its "
                     "own ports")
        notes.append(
            f"node {address} is out (nodes[].out): {went}. Nothing on {address} is contacted: "
            "`scripts/kimipd -s STACK up` runs this update without its resources and then drops "
            "them from the state (a plain `pulumi up` would dial it to delete them). Set out "
            "back to false to prepare it again from scratch.")
    return notes

