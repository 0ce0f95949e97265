"""Shared fixtures: the repository's stack files, loaded as plain data."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from components.config import read_stack_file

REPO = Path(__file__).resolve().parent.parent
STACK_FILES = sorted(REPO.glob("Pulumi.*.yaml"))


def stack_values(stack: str) -> dict[str, Any]:
    return read_stack_file(REPO / f"Pulumi.{stack}.yaml")


@pytest.fixture
def pro6000() -> dict[str, Any]:
    """A fresh, mutable copy of the production stack's values."""
    return copy.deepcopy(stack_values("pro6000"))
