"""The gates section's own rules."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


def gate_polls_twice(cfg: ClusterConfig) -> Iterable[str]:
    gates = cfg.gates
    if gates.interval_seconds > gates.timeout_seconds:
        yield (f"gates.intervalSeconds: {gates.interval_seconds:g} is longer than "
               f"gates.timeoutSeconds {gates.timeout_seconds}, so a gate polls once and gives up "
               "before its second poll (a group still loading fails its gate): set "
               f"intervalSeconds to {gates.timeout_seconds} or less (default 1).")
