"""Shared fixtures: the repository's stack files, loaded as plain data."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import stack_file_values

REPO = Path(__file__).resolve().parent.parent
STACK_FILES = sorted(REPO.glob("Pulumi.*.yaml"))


def stack_values(stack: str) -> dict[str, Any]:
    return stack_file_values(yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text()))


@pytest.fixture
def pro6000() -> dict[str, Any]:
    """A fresh, mutable copy of the production stack's values."""
    return copy.deepcopy(stack_values("pro6000"))
