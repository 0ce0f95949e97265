"""The roles `kimipd orphans` judges by (components/render/naming.py, read by ops/stack.py) are the
ones the program labels its containers with: every shipped stack under Pulumi's mocks."""

from __future__ import annotations

import pytest

from components.config import load_cluster_config
from components.render import ROUTER, container_roles
from tests.conftest import stack_values
from tests.program.harness import run_program, with_local_files


@pytest.mark.parametrize("stack", ["sim", "sim-2p2d", "pro6000"])
def test_every_container_the_program_creates_has_a_role_orphans_knows(
        stack: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    values = stack_values(stack)
    for node_file in values.get("nodeFiles", []):
        node_file.pop("sha256", None)  # with_local_files writes stand-in files
    values = with_local_files(values, tmp_path_factory.mktemp(stack))
    created = set(run_program(values).containers())
    known = container_roles(load_cluster_config(values))
    assert created <= known, sorted(created - known)
    # The other way round, only the single router's role, kept for a stack that moved to the
    # door (its door then replaces that container).
    assert known - created <= {ROUTER}, sorted(known - created)
