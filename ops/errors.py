"""The one error type of the operator tools' reading of a stack."""

from __future__ import annotations


class StackError(Exception):
    """The stack cannot be read: no CLI, no such stack, a config the model refuses, outputs of
    another version."""
