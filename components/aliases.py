"""The URNs that earlier shapes of the stack gave the router's resources, for the aliases that
let a stack move between them without replacing what did not change."""

from __future__ import annotations

import pulumi

from .render import CLUSTER_TYPE


def component_urn(type_: str, name: str) -> str:
    return (f"urn:pulumi:{pulumi.get_stack()}::{pulumi.get_project()}::"
            f"{CLUSTER_TYPE}${type_}::{name}")


def old_router_urn() -> str:
    return component_urn("kimipd:router:Router", "router")


def single_router_container_alias() -> pulumi.Alias:
    """The single router's container, as the door's container on router.node knows it."""
    return pulumi.Alias(name="router", parent=old_router_urn())


def door_container_alias() -> pulumi.Alias:
    """router.node's door container, as the single router's container knows it (a stack
    leaving the door)."""
    return pulumi.Alias(name="door", parent=component_urn("kimipd:router:Door", "door"))
