"""Shared fixtures: the repository's stack files, loaded as plain data."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from components.config import read_stack_file

REPO = Path(__file__).resolve().parent.parent
STACK_FILES = sorted(REPO.glob("Pulumi.*.yaml"))


# The sim stacks name the sim's key, known_hosts and node files under the default cache.
DEFAULT_CACHE = "~/.cache/kimipd/"


def stack_values(stack: str) -> dict[str, Any]:
    """A stack file's values; under another KIMIPD_CACHE, the sim's paths are that cache's."""
    values = read_stack_file(REPO / f"Pulumi.{stack}.yaml")
    cache = os.environ.get("KIMIPD_CACHE")
    if not cache:
        return values
    return json.loads(json.dumps(values).replace(DEFAULT_CACHE, cache.rstrip("/") + "/"))


@pytest.fixture
def pro6000() -> dict[str, Any]:
    """A fresh, mutable copy of the production stack's values."""
    return copy.deepcopy(stack_values("pro6000"))


@pytest.fixture(scope="session", autouse=True)
def _simulated_cluster_down_at_the_end():
    """A session that brought the simulated cluster up takes it down again, once."""
    yield
    from tests.integration.sim import stop_sim_at_session_end

    stop_sim_at_session_end()
