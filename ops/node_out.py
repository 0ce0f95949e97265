"""`kimipd up` / `kimipd preview`: `pulumi up` / `pulumi preview` that never dial a node taken
out (`nodes[].out`). The program declares nothing on such a node; what the state still holds of
it would be deleted by the engine through its node (a remote command's delete dials 11 times,
15 s each; a container's needs its docker engine). So the update runs with those resources
excluded (`--exclude`: kept in the state, untouched), and once it has converged they are dropped
from the state (`pulumi state delete`), which contacts nothing. The groups that leave with the
node are deleted by the update itself: drained out of every router slot on the router's node
first, their ranks on other nodes stopped (docs/decisions.md, "Taking a node out")."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from pulumi import automation as auto
from pydantic import ValidationError

from components.config import NodeSpec

from .contract_change import StepInputs
from .stack import StackError, config_values
from .stack_engine import StackEngine
from .state_urns import DOCKER_PROVIDER, docker_host_address


@dataclass(frozen=True)
class StateResource:
    urn: str
    type: str
    parent: str | None
    provider: str | None
    host: str | None  # a remote command's connection host
    docker_host: str | None  # a docker provider's ssh:// host
    dependencies: tuple[str, ...] = ()

    @classmethod
    def from_export(cls, entry: Mapping[str, Any]) -> StateResource:
        inputs = entry.get("inputs") or {}
        connection = _revealed(inputs.get("connection"))
        host = connection.get("host") if isinstance(connection, Mapping) else None
        docker_host = inputs.get("host") if entry.get("type") == DOCKER_PROVIDER else None
        provider = entry.get("provider")
        return cls(urn=entry["urn"], type=entry.get("type", ""), parent=entry.get("parent"),
                   provider=provider.rsplit("::", 1)[0] if provider else None,
                   host=host if isinstance(host, str) else None,
                   docker_host=docker_host if isinstance(docker_host, str) else None,
                   dependencies=tuple(entry.get("dependencies") or ()))


# How a secret value reads in `pulumi stack export --show-secrets` (the Automation API's
# export): the state format's signature key and secret signature (Pulumi's
# sdk/go/common/resource/sig: `Key`, `Secret`), the value as JSON text under "plaintext".
SECRET_SIGNATURE = ("4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270")


def _revealed(value: Any) -> Any:
    """A connection is secret as a whole (its private key is): only its host is kept here."""
    if isinstance(value, Mapping) and value.get(SECRET_SIGNATURE[0]) == SECRET_SIGNATURE[1]:
        try:
            plain = json.loads(value.get("plaintext") or "null")
        except ValueError:
            return None
        return {"host": plain.get("host")} if isinstance(plain, Mapping) else None
    return value


def state_resources(export: Mapping[str, Any]) -> list[StateResource]:
    deployment = export.get("deployment") or {}
    return [StateResource.from_export(entry) for entry in deployment.get("resources") or []]


def resources_on(resources: Iterable[StateResource], addresses: Iterable[str],
                 deleted: Iterable[str] = ()) -> list[str]:
    """The URNs an update must not touch for the nodes at ADDRESSES: every remote command that
    connects to one, its docker provider and everything that provider serves, and the components
    above them that the update deletes (DELETED: the preview's delete steps), so no resource is
    left in the state without its parent. In state order (parents before children)."""
    wanted = set(addresses)
    resources = list(resources)
    providers = {r.urn for r in resources
                 if r.docker_host is not None and docker_host_address(r.docker_host) in wanted}
    on_node = {r.urn for r in resources
               if r.host in wanted or r.urn in providers or r.provider in providers}
    by_urn = {r.urn: r for r in resources}
    going = set(deleted)
    for urn in list(on_node):
        parent = by_urn[urn].parent
        while parent and parent in by_urn and parent in going and parent not in on_node:
            on_node.add(parent)
            parent = by_urn[parent].parent
    return [r.urn for r in resources if r.urn in on_node]


def dependents_of(resources: Iterable[StateResource], urns: Iterable[str]) -> set[str]:
    """Every resource that depends on one of URNS, transitively (URNS themselves excluded)."""
    resources = list(resources)
    found: set[str] = set()
    frontier = set(urns)
    while frontier:
        frontier = {r.urn for r in resources
                    if r.urn not in found and frontier & set(r.dependencies)}
        found |= frontier
    return found - set(urns)


def out_addresses(config: Mapping[str, Any]) -> list[str]:
    """The nodes the stack's config takes out (`pulumi config --json`'s shape: key -> value,
    a structured one as JSON text), read by the config's own node model: an update that takes
    a node out has not yet put it in the outputs."""
    try:
        nodes = [NodeSpec.model_validate(node)
                 for node in config_values(config).get("nodes") or []]
    except ValidationError as error:
        raise StackError(f"kimipd:nodes: {error}") from None
    return [node.address for node in nodes if node.out]


def preview_deletes(steps: Iterable[Mapping[str, Any]]) -> set[str]:
    """What the update deletes and does not create again. Not a replacement's delete: the
    resource is still in the state afterwards (slot b's door drain, replaced when slot b stands
    in on router.node), and destroying it as a leftover would run its delete, a drain."""
    return {step["urn"] for step in steps if step.get("op") == "delete"}


class OutUpdate:
    """One stack's preview or update with its out nodes' resources excluded, then dropped.

    Through the Automation API with the program inline, as `kimipd reconcile` runs it (the CLI
    on PATH, the caller's backend and passphrase), so it needs no language host."""

    def __init__(self, engine: StackEngine, out: TextIO = sys.stdout,
                 confirm: Callable[[str], str] = input) -> None:
        self.engine, self.out, self.confirm = engine, out, confirm

    def excluded(self) -> tuple[list[str], list[str], set[str]]:
        """(out node addresses, the URNs of the state's resources on them, every URN the
        update deletes)."""
        stack = self.engine.stack
        addresses = out_addresses({key: {"value": value.value, "secret": value.secret}
                                   for key, value in stack.get_all_config().items()})
        if not addresses:
            return [], [], set()
        resources = state_resources({"deployment": stack.export_stack().deployment or {}})
        if not resources_on(resources, addresses):
            return addresses, [], set()
        # A dry run: no provider is called, no node dialled; it says which components go.
        steps: list[dict[str, str]] = []
        stack.preview(on_event=lambda event: steps.append(
            {"op": auto.OpType(event.resource_pre_event.metadata.op).value,
             "urn": event.resource_pre_event.metadata.urn})
            if event.resource_pre_event is not None else None)
        deleted = preview_deletes(steps)
        return addresses, resources_on(resources, addresses, deleted), deleted

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _preview(self, urns: list[str], diff: bool) -> None:
        """The preview as the engine prints it, then a change of the serving contract named
        with how it will roll (ops/contract_change.py)."""
        steps = StepInputs()
        with self.engine.policy() as policy:
            self.engine.stack.preview(exclude=urns or None, diff=diff, on_event=steps,
                                      on_output=lambda line: self._say(line),
                                      policy_packs=policy.packs,
                                      policy_pack_configs=policy.configs)
        change = steps.change()
        if change is not None:
            self._say(change.note())

    def preview(self, diff: bool) -> int:
        addresses, urns, _ = self.excluded()
        self._announce(addresses, urns, "preview")
        self._preview(urns, diff)
        return 0

    def up(self, diff: bool, yes: bool, message: str | None = None) -> int:
        addresses, urns, deleted = self.excluded()
        self._announce(addresses, urns, "up")
        stack = self.engine.stack
        if not yes:
            self._preview(urns, diff)
            if self.confirm("Do you want to perform this update? [yes/no] ").strip() != "yes":
                self._say("kimipd up: not confirmed; nothing changed")
                return 1
        try:
            with self.engine.policy() as policy:
                stack.up(exclude=urns or None, diff=diff, message=message, show_secrets=False,
                         on_output=lambda line: self._say(line), policy_packs=policy.packs,
                         policy_pack_configs=policy.configs)
        except auto.CommandError as error:
            self._say(f"kimipd up: the update failed; {len(urns)} resources of the nodes out "
                      f"stay in the state: {str(error).strip().splitlines()[-1][:300]}")
            return 1
        if urns:
            # The engine keeps what an excluded resource depends on: a leaving group's rank on
            # a node that stays, which the gate check of its rank 0 (on the node out) depends
            # on. So the out node's resources that depend on such leftovers leave the state
            # first, then the leftovers are destroyed for real (on nodes that answer), then the
            # rest of the out node's resources leave the state.
            after = state_resources({"deployment": stack.export_stack().deployment or {}})
            left = [r.urn for r in after if r.urn in deleted and r.urn not in urns]
            first = dependents_of(after, left) & set(urns)
            self._state_delete([urn for urn in urns if urn in first])
            if left:
                try:
                    stack.destroy(target=left, message=message, show_secrets=False,
                                  on_output=lambda line: self._say(line))
                except auto.CommandError as error:
                    self._say(f"kimipd up: deleting what the leaving groups left on the nodes "
                              f"that stay failed: {str(error).strip().splitlines()[-1][:300]}")
                    return 1
            self._state_delete([urn for urn in urns if urn not in first])
            self._say(f"kimipd up: {len(urns)} resources of {', '.join(addresses)} dropped from "
                      "the state, none contacted")
        return 0

    def _state_delete(self, urns: list[str]) -> None:
        """`pulumi state delete`, children before parents (a parent with a child still in the
        state is refused); it contacts nothing."""
        self.engine.delete_from_state(list(reversed(urns)))

    def _announce(self, addresses: list[str], urns: list[str], operation: str) -> None:
        if urns:
            self._say(f"kimipd {operation}: {', '.join(addresses)} out: {len(urns)} resources "
                      f"there are left out of this {operation} and not contacted"
                      + ("; dropped from the state once it converges" if operation == "up"
                         else ""))
        elif addresses:
            self._say(f"kimipd {operation}: {', '.join(addresses)} out; the state holds nothing "
                      "of them")
