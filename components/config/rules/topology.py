"""Topology and GPUs: which node runs which rank, and whether its GPUs hold it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


def unknown_nodes(cfg: ClusterConfig) -> Iterable[str]:
    known = {node.address for node in cfg.nodes}
    fix = "add it to `nodes` or use one of " + ", ".join(sorted(known))
    for name, group in cfg.groups.items():
        for rank, address in enumerate(group.nodes):
            if address not in known:
                yield f"groups.{name}.nodes[{rank}]: {address!r} is not a declared node; {fix}."
    for key, address in (("mooncakeMaster.node", cfg.mooncake_master.node),
                         ("router.node", cfg.router.node)):
        if address not in known:
            yield f"{key}: {address!r} is not a declared node; {fix}."


def duplicate_nodes(cfg: ClusterConfig) -> Iterable[str]:
    seen: set[str] = set()
    for index, node in enumerate(cfg.nodes):
        if node.address in seen:
            yield (f"nodes[{index}].address: {node.address!r} is declared twice; "
                   "keep one entry per host.")
        seen.add(node.address)


def group_shape(cfg: ClusterConfig) -> Iterable[str]:
    for name, group in cfg.groups.items():
        key = f"groups.{name}"
        seen: set[str] = set()
        for rank, address in enumerate(group.nodes):
            if address in seen:
                first = group.nodes.index(address)
                yield (f"{key}.nodes[{rank}]: {address!r} already holds rank {first}; one rank "
                       "per node, each node once.")
            seen.add(address)
        if group.dist_init_host is not None and group.dist_init_host != group.rank0:
            yield (f"{key}.distInitHost: {group.dist_init_host!r} is not the group's first node "
                   f"{group.rank0!r}; rank 0 runs on the first node of `nodes` and every rank "
                   "dials it: reorder `nodes` or remove distInitHost.")
        # A duplicate or undeclared node is refused above; its GPUs would only mislead here.
        tp_spans = True
        if seen <= _addresses(cfg) and len(seen) == len(group.nodes):
            gpus = sum(cfg.node(address).gpus for address in group.nodes)
            tp_spans = group.tp_size == gpus
            if not tp_spans:
                yield (f"{key}.tpSize: {group.tp_size} does not span the group's GPUs "
                       f"({len(group.nodes)} nodes, {gpus} GPUs); SGLang shards one server "
                       f"over every GPU of its nodes: set tpSize to {gpus} or change the nodes.")
        # While tpSize itself is refused, its fix decides what epSize must fit: no verdict yet.
        if tp_spans and group.ep_size > group.tp_size:
            yield (f"{key}.epSize: {group.ep_size} exceeds tpSize {group.tp_size}; experts are "
                   f"sharded over the tensor-parallel ranks: set epSize <= {group.tp_size}.")
        elif tp_spans and group.tp_size % group.ep_size:
            divisors = [n for n in range(1, group.tp_size + 1) if group.tp_size % n == 0]
            yield (f"{key}.epSize: {group.ep_size} does not divide tpSize {group.tp_size}; "
                   "SGLang splits the tensor-parallel ranks into epSize expert groups of equal "
                   "size (0.5.19 stops loading with 'tp_size must be divisible by ep_size'): "
                   f"set epSize to a divisor of {group.tp_size} "
                   f"({', '.join(map(str, divisors))}).")
        last = group.dist_init_port + 7
        if len(group.nodes) > 1 and last > 65535:
            yield (f"{key}.distInitPort: {group.dist_init_port} leaves no room for the 7 ports "
                   f"rank 0 binds after it (up to {last}, past 65535): set it to "
                   f"{65535 - 7} or lower.")


def _addresses(cfg: ClusterConfig) -> set[str]:
    return {node.address for node in cfg.nodes}


def groups_share_no_node_per_mode(cfg: ClusterConfig) -> Iterable[str]:
    for mode in ("prefill", "decode"):
        owner: dict[str, str] = {}
        for name, group in cfg.groups_in_mode(mode).items():
            for rank, address in enumerate(group.nodes):
                if address in owner and owner[address] != name:
                    yield (f"groups.{name}.nodes[{rank}]: {address!r} is already in {mode} group "
                           f"{owner[address]!r}; a node's GPUs serve one {mode} group: use "
                           "another node.")
                owner.setdefault(address, name)


def both_modes_present(cfg: ClusterConfig) -> Iterable[str]:
    written = ", ".join(f"{name}: {group.mode}" for name, group in cfg.groups.items())
    for mode in ("prefill", "decode"):
        if not cfg.groups_in_mode(mode):
            yield (f"groups: no group has mode {mode!r} ({written}); PD disaggregation needs at "
                   f"least one prefill and one decode group: add a group with `mode: {mode}`.")


# What docker takes after a container name's first character; each rank's is kimipd-GROUP-rRANK.
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9_.-]+")


def group_names(cfg: ClusterConfig) -> Iterable[str]:
    for name in cfg.groups:
        if not _CONTAINER_NAME.fullmatch(name):
            tidy = re.sub(r"[^a-zA-Z0-9_.-]+", "-", name).strip("-_.") or "prefill"
            yield (f"groups: {name!r} cannot be part of a container name (kimipd-{name}-r0): "
                   "docker takes letters, digits, `_`, `.` and `-` only: rename the group, e.g. "
                   f"{tidy!r}.")


def gpus_per_node(cfg: ClusterConfig) -> Iterable[str]:
    """Each rank claims tpSize / len(nodes) GPUs of its node, starting at GPU 0 (every container
    sees all of the node's GPUs); together the ranks on a node must fit in its `gpus`."""
    known = _addresses(cfg)
    claims: dict[str, list[tuple[str, str, int, int]]] = {}  # address -> (group, mode, rank, gpus)
    for name, group in cfg.groups.items():
        nodes = group.nodes
        # Duplicate or undeclared nodes, or a tpSize that does not span the nodes: refused above.
        if len(set(nodes)) != len(nodes) or not set(nodes) <= known:
            continue
        if group.tp_size != sum(cfg.node(address).gpus for address in nodes):
            continue
        if group.tp_size % len(nodes):
            yield (f"groups.{name}.tpSize: {group.tp_size} is not a multiple of the group's "
                   f"{len(nodes)} nodes; SGLang gives every rank tpSize / nodes GPUs, so the "
                   "nodes' GPU counts must be equal: give the group nodes with the same number of "
                   "GPUs.")
            continue
        for rank, address in enumerate(nodes):
            claims.setdefault(address, []).append(
                (name, group.mode, rank, group.tp_size // len(nodes)))
    for index, node in enumerate(cfg.nodes):
        on_node = claims.get(node.address, [])
        modes = [mode for _, mode, _, _ in on_node]
        total = sum(gpus for _, _, _, gpus in on_node)
        # Two groups of one mode on a node are refused by groups_share_no_node_per_mode.
        if total <= node.gpus or len(modes) != len(set(modes)):
            continue
        name, _, rank, gpus = on_node[-1]
        key = f"groups.{name}.nodes[{rank}]"
        if len(on_node) == 1:
            yield (f"{key}: {node.address!r} has {node.gpus} GPUs (nodes[{index}].gpus), but "
                   f"{name} rank {rank} would use {gpus} (tpSize {cfg.groups[name].tp_size} / "
                   f"{len(cfg.groups[name].nodes)} nodes; SGLang gives every rank the same "
                   "share): give the group nodes with the same number of GPUs.")
            continue
        listed = ", ".join(f"{group} rank {r}: {n}" for group, _, r, n in on_node)
        yield (f"{key}: {node.address!r} already runs "
               f"{', '.join(f'{g} rank {r}' for g, _, r, _ in on_node[:-1])}; its ranks would "
               f"claim {total} GPUs ({listed}) of its {node.gpus} (nodes[{index}].gpus), and "
               "every container sees all of the node's GPUs from GPU 0, so the groups would load "
               "onto the same GPUs: give each group nodes of its own.")


def out_nodes_keep_the_cluster_serving(cfg: ClusterConfig) -> Iterable[str]:
    """A node taken out takes its groups with it; what must stay refuses it."""
    out = {node.address: index for index, node in enumerate(cfg.nodes) if node.out}
    if not out:
        return
    for address, index in out.items():
        key = f"nodes[{index}].out"
        if address == cfg.router.node:
            yield (f"{key}: {address!r} holds the router (router.node): its slot, the slot "
                   "lease and the rollout's markers are there (with two door nodes the other "
                   "only follows): move router.node to a node that stays, in its own reviewed "
                   "`up`, before taking this one out.")
        if address == cfg.mooncake_master.node:
            yield (f"{key}: {address!r} runs the Mooncake master (mooncakeMaster.node), which "
                   "every group's KV transfer needs: set mooncakeMaster.node to a node that "
                   "stays in the same edit (every group restarts against the new master, one "
                   "at a time).")
    for mode in ("prefill", "decode"):
        groups = cfg.groups_in_mode(mode)
        staying = [name for name, group in groups.items() if not set(group.nodes) & set(out)]
        if groups and not staying:
            leaving = ", ".join(f"{name} (on {', '.join(sorted(set(group.nodes) & set(out)))})"
                                for name, group in groups.items())
            yield (f"nodes[].out: every {mode} group would leave with the nodes taken out: "
                   f"{leaving}; the cluster would serve nothing. Keep one {mode} group's nodes "
                   "in, or move a group to nodes that stay.")
