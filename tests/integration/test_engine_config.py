"""The real engine refuses bad stacks before any resource is registered.

These run the real Pulumi CLI and engine (built from Go modules by scripts/install-pulumi) with
the program inline; they need no resource plugin, because nothing reaches a provider.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from pulumi import automation as auto

from tests.conftest import stack_values
from sim.automation import Project, engine_env

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return engine_env()


@pytest.fixture
def project(tmp_path: Path, env: dict[str, str]) -> Project:
    return Project(tmp_path, env)


def preview_error(project: Project, values: dict) -> tuple[str, list[str]]:
    """Preview a stack with these values; return the engine's output and the resource types it saw."""
    project.write_stack("bad", values)
    stack = project.stack("bad")
    seen: list[str] = []

    def on_event(event: auto.EngineEvent) -> None:
        if event.resource_pre_event is not None:
            seen.append(event.resource_pre_event.metadata.type)

    with pytest.raises(auto.CommandError) as error:
        stack.preview(on_event=on_event)
    return str(error.value), seen


def test_hard_rule_is_refused_before_any_resource(project: Project) -> None:
    values = copy.deepcopy(stack_values("pro6000"))
    values["groups"]["decode"]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    output, seen = preview_error(project, values)
    assert "groups.decode.env.PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True'" in output
    assert "Mooncake RDMA registration fail" in output
    assert set(seen) <= {"pulumi:pulumi:Stack"}, f"resources registered despite the error: {seen}"


def test_unknown_key_is_refused_by_name(project: Project) -> None:
    values = copy.deepcopy(stack_values("pro6000"))
    values["routr"] = {"node": "174.1.60.5"}
    output, seen = preview_error(project, values)
    assert "routr: unknown key" in output
    assert set(seen) <= {"pulumi:pulumi:Stack"}


def test_missing_node_files_are_refused_before_any_resource(project: Project) -> None:
    output, seen = preview_error(project, copy.deepcopy(stack_values("pro6000")))
    assert "nodeFiles[0].source: '/tmp/patch_k3_sm120.py' does not exist on this machine" in output
    assert set(seen) <= {"pulumi:pulumi:Stack"}


def test_the_cli_enforces_pulumi_yaml_types(project: Project) -> None:
    values = copy.deepcopy(stack_values("pro6000"))
    values["serving"] = "maybe"
    output, _ = preview_error(project, values)
    assert "configuration key 'serving' must be of type 'boolean'" in output
