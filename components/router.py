"""sglang-router in PD mode: the one on router.port, or one of the door's two slots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command

from .aliases import door_container_alias
from .config import ClusterConfig
from .containers import node_container
from .door import Door
from .gates import HealthGate
from .node import Node
from .render import (
    restore_command,
    router_plan,
    router_url,
    slot_admit_command,
    slot_door_admit_command,
    slot_door_drain_command,
    slot_drain_command,
    slot_unwant_command,
    slot_want_command,
)
from .router_api_key import RouterApiKey


class Router(pulumi.ComponentResource):
    """sglang-router in PD mode: the one on router.port, or one of the door's two slots. MiniLB
    starts once every group is ready (its worker list is fixed); the rust router starts with
    the nodes, and each group's Membership admits it."""

    url: pulumi.Output[str]

    def __init__(self, cfg: ClusterConfig, nodes: Mapping[str, Node],
                 wait_for: Sequence[pulumi.Resource], api_key: RouterApiKey | None = None,
                 slot: str | None = None, doors: Sequence[Door] = (),
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = router_plan(cfg, slot)
        super().__init__("kimipd:router:Router", plan.role, None, opts)
        self.role = plan.role
        node = nodes[plan.node]
        # Slot b standing in on router.node (the other door node out): its container and gate
        # check under names of their own, so the copies on the node out are deleted (left out
        # and dropped by `kimipd up`) and these created, not moved (docs/decisions.md).
        placed = (f"{plan.role}-stand-in" if slot is not None and cfg.slot_stands_in(slot)
                  else plan.role)
        # Where the markers, the leases and the scripts that talk to every slot are: router.node
        # (slot b on the other door node included, reached at its node's address).
        state_node = nodes[cfg.router.node]
        extra_labels: dict[str, pulumi.Input[str]] = {}
        key_files: list[pulumi.Resource] = []
        if api_key is not None:
            extra_labels["kimipd.api-key-file"] = api_key.file.id
            key_files.append(api_key.file)
        # The node's pulled image, not the prepared one: the node files (Mooncake, patches) are
        # nothing to the router, so a change of them rolls the groups and leaves the router up.
        self.container = node_container(
            plan, node, depends_on=[*wait_for, *key_files],
            parent=self, extra_labels=extra_labels, resource_name=placed,
            # The single router on router.port replaces the door's container there.
            aliases=[door_container_alias()] if slot is None else (),
            image=node.image_id if cfg.router.kind == "rust" else None,
            stop_grace_seconds=(cfg.router.drain_timeout_seconds + 5
                                if cfg.router.kind == "rust" else None))
        self.gate = HealthGate(f"{placed}-ready", cfg, nodes, [plan], [self.container],
                               opts=pulumi.ResourceOptions(parent=self), check_prefix=placed)
        self.restore: command.remote.Command | None = None
        if cfg.router.kind == "rust":
            # A new router starts with no worker: the groups already serving join it at once,
            # without waiting for their admissions (which also wait for their own gates).
            self.restore = command.remote.Command(
                f"{plan.role}-restore",
                connection=state_node.connection,
                create=restore_command(cfg, slot),
                triggers=[self.container.id],
                # Its old copy goes first (it has no delete command): when slot b moves off a
                # node out, a copy left to be deleted last depends on that node's resources,
                # which `kimipd up` leaves out, and kept the state from dropping them.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.gate],
                                            delete_before_replace=True))
        self.at_door: command.remote.Command | None = None
        if slot is not None and doors:
            self._behind_doors(cfg, nodes, slot, doors)
        self.url = pulumi.Output.from_input(router_url(cfg))
        self.register_outputs({"url": self.url})

    def _behind_doors(self, cfg: ClusterConfig, nodes: Mapping[str, Node], slot: str,
                      doors: Sequence[Door]) -> None:
        """The slot's place at each door, like a group's in the router (render/membership.py):
        drained at every door before its container goes, set ready at each once it serves.
        router.node's door decides (the slot lease and the markers are there); the other door
        node's follows: drained after it, ready before it gives the lease back."""
        role = self.role
        node = nodes[cfg.router.node]
        door = next(door for door in doors if door.address == cfg.router.node)
        others = [other for other in doors if other is not door]
        # Deleted after router.node's drain (which depends on them): no new request at either
        # door, then this door's open ones end.
        self.other_door_drains = [
            command.remote.Command(
                f"{role}-{other.role}-drain",
                connection=nodes[other.address].connection,
                create="true",
                delete=slot_door_drain_command(cfg, slot),
                triggers=[self.container.id],
                opts=pulumi.ResourceOptions(parent=self,
                                            depends_on=[self.container, other.container]))
            for other in others]
        # Replaced with the container, deleted before it: its delete is the drain, which waits
        # for the slot lease (the other slot up at the door): Pulumi alone would replace both
        # slots at once (delete-before-replace deletes dependents first). Deleted before its
        # own replacement too: when slot b moves (a container of another name), the old drain
        # would otherwise run last, after the new slot's admission.
        self.door_drain = command.remote.Command(
            f"{role}-door-drain",
            connection=node.connection,
            create="true",
            delete=slot_drain_command(cfg, slot),
            triggers=[self.container.id],
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=[
                self.container, door.container, *self.other_door_drains]))
        # "This slot should serve": gone first on destroy, so the drain then waits for nothing.
        self.door_want = command.remote.Command(
            f"{role}-door-want",
            connection=node.connection,
            create=slot_want_command(cfg, slot),
            delete=slot_unwant_command(cfg, slot),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.door_drain]))
        restored = [self.restore] if self.restore else []
        # Ready at the other door node's door first: router.node's admission gives the lease
        # back, and the other slot's drain may then start.
        self.other_door_admits = [
            command.remote.Command(
                f"{role}-{other.role}-admit",
                connection=nodes[other.address].connection,
                create=slot_door_admit_command(cfg, slot),
                triggers=[self.container.id],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[
                    self.gate, other.gate, self.door_want, drain, *restored]))
            for other, drain in zip(others, self.other_door_drains, strict=True)]
        self.at_door = command.remote.Command(
            f"{role}-door-admit",
            connection=node.connection,
            create=slot_admit_command(cfg, slot),
            triggers=[self.container.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                self.gate, door.gate, self.door_want, self.door_drain, *restored,
                *self.other_door_admits]))
