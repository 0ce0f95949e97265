"""The engine modules' order: those that share a stack (engine.shared_2p2d) run back to back,
in engine.SHARED_2P2D_MODULES' order, where the first of them would have run: a module of its
own stack between them would remove the shared stack's containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.engine import SHARED_2P2D_MODULES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    sharing = [item for item in items if "shared_2p2d" in item.fixturenames]
    if not sharing:
        return
    first = items.index(sharing[0])
    others = [item for item in items if "shared_2p2d" not in item.fixturenames]
    # sorted() is stable: each module's tests keep their file order.
    sharing = sorted(sharing, key=lambda item: SHARED_2P2D_MODULES.index(Path(str(item.path)).name))
    items[:] = others[:first] + sharing + others[first:]
