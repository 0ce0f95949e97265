"""Shared fixtures: the repository's stack files, loaded as plain data."""

from __future__ import annotations

from types import ModuleType

import sys

import importlib.util

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import read_stack_file
from sim.cache import follow_cache

REPO = Path(__file__).resolve().parent.parent
STACK_FILES = sorted(REPO.glob("Pulumi.*.yaml"))


def stack_values(stack: str) -> dict[str, Any]:
    """A stack file's `kimipd:*` values, the sim's key, known_hosts and node files under the
    run's KIMIPD_CACHE (sim/cache.py): whichever cache the file names them under (the default,
    or another that scripts/setup-stack-sim set in Pulumi.sim.yaml)."""
    return follow_cache(read_stack_file(REPO / f"Pulumi.{stack}.yaml"))


def without_the_door(values: dict[str, Any]) -> dict[str, Any]:
    """VALUES with the single router on router.port instead of the door and its slots: for the
    tests whose subject is that router (every shipped stack has the door)."""
    values["router"] = {key: value for key, value in values["router"].items() if key != "door"}
    return values


def observability_stack_values(stack: str) -> dict[str, Any]:
    """observability/Pulumi.STACK.yaml's `kimipd-observability:*` values (namespace stripped),
    the sim's paths under the run's KIMIPD_CACHE, as stack_values."""
    document = yaml.safe_load((REPO / "observability" / f"Pulumi.{stack}.yaml").read_text())
    return follow_cache({key.split(":", 1)[1]: value
                         for key, value in (document.get("config") or {}).items()})


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


# Wall time per test module (setup, calls and teardown, module fixtures included), printed at
# the end of the run: where the full run's minutes go (docs/tests.md keeps the figures).
_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _module_seconds:
        return
    # scripts/test reads them back for the run's budget (tests/run_times.py).
    times_file = os.environ.get("KIMIPD_MODULE_TIMES")
    if times_file:
        Path(times_file).write_text(json.dumps(_module_seconds))
    terminalreporter.section("wall time per module")
    for module, seconds in sorted(_module_seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {module}")
    terminalreporter.write_line(f"{sum(_module_seconds.values()):8.1f} s  in all")


def asset_script(name: str) -> ModuleType:
    """assets/NAME as a module (it imports router_api.py beside it), without writing bytecode
    beside it."""
    path = REPO / "assets" / name
    sys.path.insert(0, str(path.parent))
    bytecode = sys.dont_write_bytecode
    try:
        spec = importlib.util.spec_from_file_location(name.replace("-", "_")[:-3], path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
        sys.dont_write_bytecode = bytecode
    return module
