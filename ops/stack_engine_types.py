"""What the Pulumi access layer (ops/stack_engine.py) gives back, as plain data: what the heal
policy reads of a stack's history without depending on the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateEntry:
    """One entry of the stack's history, as much as the checks need."""

    kind: str
    message: str
    started: float
    ended: float | None
    result: str
