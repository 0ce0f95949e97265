"""components/cycle_check.py: the same answers and edges as the SDK's cycle check, and only over
the SDK it was checked against."""

from __future__ import annotations

import importlib.metadata
import random

import pytest
from pulumi.runtime import resource_cycle_breaker, rpc

from components import cycle_check


class Thing:
    """What the cycle breaker needs of a resource: attributes and identity."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def sdk_declare(from_resource: object, to_resource: object) -> bool:
    """pulumi 3.272.0's `declare_dependency`, from the functions it calls (the module's source
    is pinned by cycle_check.PINNED_SOURCES)."""
    if resource_cycle_breaker._reachable(from_resource=to_resource,  # type: ignore[arg-type]
                                         to_resource=from_resource):  # type: ignore[arg-type]
        return False
    resource_cycle_breaker._add_dep(from_resource, to_resource)  # type: ignore[arg-type]
    return True


def edges(things: list[Thing]) -> dict[str, set[str]]:
    return {thing.name: {d.name for d in resource_cycle_breaker._deps(thing)}  # type: ignore[arg-type]
            for thing in things}


def test_the_pinned_sdk_gets_the_cheaper_check() -> None:
    """Fails when requirements.txt moves pulumi: read the new resource_cycle_breaker.py and
    rpc._add_dependency, then update PINNED_VERSION and PINNED_SOURCES (or drop the module if
    the SDK's own check has become cheap)."""
    assert importlib.metadata.version("pulumi") == cycle_check.PINNED_VERSION
    assert cycle_check.applies()


@pytest.mark.parametrize("seed", range(20))
def test_same_answers_and_edges_as_the_sdk(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.randint(2, 30)
    ours = [Thing(f"r{i}") for i in range(size)]
    sdks = [Thing(f"r{i}") for i in range(size)]
    for step in range(rng.randint(1, 120)):
        # Mostly edges to earlier resources (as a program registers them), some to any.
        a = rng.randrange(size)
        b = rng.randrange(a + 1) if rng.random() < 0.7 else rng.randrange(size)
        assert cycle_check.declare_dependency(ours[a], ours[b]) == sdk_declare(sdks[a], sdks[b]), (
            f"seed {seed}, step {step}: r{a} -> r{b}")
    assert edges(ours) == edges(sdks)


def test_a_cycle_is_refused_and_not_recorded() -> None:
    a, b, c = Thing("a"), Thing("b"), Thing("c")
    assert cycle_check.declare_dependency(a, b)
    assert cycle_check.declare_dependency(b, c)
    assert not cycle_check.declare_dependency(c, a)
    assert not cycle_check.declare_dependency(a, a)  # the SDK's self-dependency is a cycle too
    assert cycle_check.declare_dependency(a, c)  # a shortcut closes no cycle
    assert edges([a, b, c]) == {"a": {"b", "c"}, "b": {"c"}, "c": set()}


def test_another_sdk_keeps_its_own_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "declare_dependency", resource_cycle_breaker._reachable)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.273.0")
    assert not cycle_check.applies()
    assert not cycle_check.install()
    assert rpc.declare_dependency is resource_cycle_breaker._reachable  # untouched


def test_a_changed_source_keeps_the_sdks_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "declare_dependency", resource_cycle_breaker._reachable)
    monkeypatch.setitem(cycle_check.PINNED_SOURCES, "pulumi.runtime.rpc._add_dependency", "0" * 64)
    assert not cycle_check.install()
    assert rpc.declare_dependency is resource_cycle_breaker._reachable


def test_install_replaces_both_names_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "declare_dependency", cycle_check.SDK_DECLARE_DEPENDENCY)
    monkeypatch.setattr(resource_cycle_breaker, "declare_dependency",
                        cycle_check.SDK_DECLARE_DEPENDENCY)
    assert cycle_check.install() and cycle_check.install()
    assert rpc.declare_dependency is cycle_check.declare_dependency
    assert resource_cycle_breaker.declare_dependency is cycle_check.declare_dependency
