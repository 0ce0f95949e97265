"""components/cycle_check.py under Pulumi's mocks: the program registers exactly what it
registers with the SDK's own cycle check, and a cycle is still refused with the SDK's error."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import resource_cycle_breaker, rpc

from components import cycle_check
from tests.conftest import stack_values
from tests.program.harness import ClusterMocks, Registration, run_program, with_local_files

pytestmark = pytest.mark.timeout(120)  # the SDK's threads can hang under mocks (pulumi#7663)


def sim_2p2d(directory: Path) -> dict:
    directory.mkdir()
    values = stack_values("sim-2p2d")
    for node_file in values["nodeFiles"]:
        node_file.pop("sha256")  # with_local_files writes stand-in files
    return with_local_files(values, directory)


def edges_of(resources: list[Registration]) -> dict[str, tuple[set[str], dict[str, set[str]]]]:
    return {r.urn: (set(r.dependencies),
                    {key: set(urns) for key, urns in r.property_dependencies.items()})
            for r in resources}


def sdks_own_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cycle_check, "install", lambda: False)
    monkeypatch.setattr(rpc, "declare_dependency", cycle_check.SDK_DECLARE_DEPENDENCY)
    monkeypatch.setattr(resource_cycle_breaker, "declare_dependency",
                        cycle_check.SDK_DECLARE_DEPENDENCY)


def test_the_program_registers_the_same_edges_as_with_the_sdks_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = run_program(sim_2p2d(tmp_path / "ours"))
    assert rpc.declare_dependency is cycle_check.declare_dependency  # the program installed it
    with monkeypatch.context() as patch:
        sdks_own_check(patch)
        sdks = run_program(sim_2p2d(tmp_path / "sdk"))
        assert rpc.declare_dependency is cycle_check.SDK_DECLARE_DEPENDENCY
    assert len(ours.resources) == len(sdks.resources)
    ours_edges, sdks_edges = edges_of(ours.resources), edges_of(sdks.resources)
    for urn, edges in sdks_edges.items():
        assert ours_edges.get(urn) == edges, urn


class Thing(pulumi.CustomResource):
    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("test:index:Thing", name, {}, opts)


class Box(pulumi.ComponentResource):
    def __init__(self, name: str) -> None:
        super().__init__("test:index:Box", name, None, None)


def test_a_resource_depending_on_its_own_parent_is_still_refused() -> None:
    """depends_on a component stands for its children, this resource among them: the SDK's
    'circular dependency' error, as without the cheaper check."""
    assert cycle_check.install()
    pulumi.runtime.set_mocks(ClusterMocks(), project="kimipd", stack="cycle", preview=False)

    @pulumi.runtime.test
    def program():
        box = Box("box")
        thing = Thing("thing", pulumi.ResourceOptions(parent=box, depends_on=[box]))
        return thing.urn

    with pytest.raises(RuntimeError, match="circular dependency involving a resource of type "
                                           "test:index:Thing named thing"):
        program()
