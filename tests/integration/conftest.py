"""The engine modules' order: those that share a stack (engine.SHARED_KINDS) run back to back,
in that kind's modules' order, where the first of them would have run: a module of its own
stack between them would remove the shared stack's containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.engine import SHARED_KINDS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for kind in SHARED_KINDS:
        sharing = [item for item in items if kind.fixture in item.fixturenames]
        if not sharing:
            continue
        first = items.index(sharing[0])
        others = [item for item in items if kind.fixture not in item.fixturenames]
        # sorted() is stable: each module's tests keep their file order.
        sharing = sorted(sharing, key=lambda item: kind.modules.index(Path(str(item.path)).name))
        items[:] = others[:first] + sharing + others[first:]
