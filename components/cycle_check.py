"""The Pulumi SDK's dependency-cycle check, made cheaper and kept exact (issue 29).

Before it records that a resource being registered depends on another (`depends_on`, or an
input that is another resource's output), pulumi 3.272.0's `declare_dependency`
(`pulumi/runtime/resource_cycle_breaker.py`) walks everything the other resource depends on,
transitively, looking for the new one. Every container, gate and admission reaches every node's
preparation through the mc-master, so at 64 nodes each of some 1,600 such mentions walked ~1,200
resources: 1.9 million steps, a third of the program's time, growing with the square of the
cluster (docs/bench.md, "B4 profile at 64 nodes").

The same question asked the other way round is cheap: a cycle closes iff the other resource is
the new one or already (transitively) depends on it, and the new one, just registered, has few
or no dependents yet. So this keeps each resource's direct dependents beside the SDK's direct
dependencies and walks those from the new resource instead. The answer, the edges the SDK
records and the error it raises on a cycle are the SDK's own; only the walk is shorter.

Installed only over the exact code it was written against (pulumi 3.272.0, these sources); any
other version, or a source that differs, keeps the SDK's own check. `install` runs before the
program registers anything (`__main__.py`): the dependents are only complete for the edges it
has seen.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pulumi.runtime import resource_cycle_breaker, rpc

PINNED_VERSION = "3.272.0"
# sha256 of `inspect.getsource` of the cycle breaker's module and of its one caller, as pulumi
# 3.272.0 ships them.
PINNED_SOURCES = {
    "pulumi.runtime.resource_cycle_breaker":
        "58bcb372e5e36ee03b06ca0eaf28dcea9696777d5c047b9ebf9bcfe98595c516",
    "pulumi.runtime.rpc._add_dependency":
        "4566782211f464dccefa999e9c431dda426520ba6c6770662ba9a14eed1b8791",
}
# Beside the SDK's own `_direct_computed_dependencies`: who depends directly on this resource.
_DEPENDENTS_PROPERTY = "_kimipd_direct_dependents"
_NAME = "declare_dependency"
# The SDK's own, as imported (the program tests run it to compare).
SDK_DECLARE_DEPENDENCY: Callable[[Any, Any], bool] = resource_cycle_breaker.declare_dependency


def declare_dependency(from_resource: Any, to_resource: Any) -> bool:
    """The SDK's `declare_dependency`: record that FROM depends on TO unless that closes a cycle
    (True if recorded, False if skipped), deciding it by walking FROM's dependents."""
    if _depends_on(to_resource, from_resource):
        return False
    resource_cycle_breaker._add_dep(from_resource, to_resource)
    dependents: set[Any] | None = getattr(to_resource, _DEPENDENTS_PROPERTY, None)
    if dependents is None:
        dependents = set()
        setattr(to_resource, _DEPENDENTS_PROPERTY, dependents)
    dependents.add(from_resource)
    return True


def _depends_on(resource: Any, target: Any) -> bool:
    """RESOURCE is TARGET or reaches it through recorded dependencies: the SDK's
    `_reachable(resource, target)`, walked from TARGET through its dependents."""
    pending, seen = [target], {id(target)}
    while pending:
        current = pending.pop()
        if current is resource:
            return True
        for dependent in getattr(current, _DEPENDENTS_PROPERTY, ()):
            if id(dependent) not in seen:
                seen.add(id(dependent))
                pending.append(dependent)
    return False


def _source_digest(target: ModuleType | Callable[..., Any]) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(target).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def applies() -> bool:
    """The installed SDK is the one this was checked against."""
    try:
        version = importlib.metadata.version("pulumi")
    except importlib.metadata.PackageNotFoundError:
        return False
    return version == PINNED_VERSION and {
        "pulumi.runtime.resource_cycle_breaker": _source_digest(resource_cycle_breaker),
        "pulumi.runtime.rpc._add_dependency": _source_digest(rpc._add_dependency),
    } == PINNED_SOURCES


def install() -> bool:
    """Use this check in the SDK if it applies (True); otherwise leave the SDK's own. Idempotent."""
    if getattr(rpc, _NAME) is declare_dependency:
        return True
    if not applies():
        return False
    # rpc imported the function by name: both names, so every caller gets this one.
    setattr(rpc, _NAME, declare_dependency)
    setattr(resource_cycle_breaker, _NAME, declare_dependency)
    return True
