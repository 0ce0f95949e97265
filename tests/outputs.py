"""Stack outputs for the tests' fakes, through the program's own model (components/outputs.py):
a fake says what it stands for (its containers on loopback, its groups, its door) and the rest
comes from a shipped stack's real outputs, so that what ops reads is always a shape the program
exports, validated as ops validates it."""

from __future__ import annotations

from typing import Any

from components.config import load_cluster_config
from components.outputs import StackOutputs, stack_outputs
from tests.conftest import stack_values

# The node files' digests a fake stack stands for (no file is read).
FAKE_DIGESTS = {"/data/node-file": "0" * 64}


def program_outputs(stack: str = "sim", values: dict[str, Any] | None = None) -> dict[str, Any]:
    """STACK's outputs as the program exports them (VALUES: its config, changed), the node-side
    values aside."""
    cfg = load_cluster_config(values if values is not None else stack_values(stack))
    return stack_outputs(cfg.in_service(), FAKE_DIGESTS, stack).exported()


def complete_outputs(partial: dict[str, Any], stack: str = "sim") -> dict[str, Any]:
    """PARTIAL (what a fake stands for, camelCase) with every required output it does not give
    taken from STACK's real outputs; validated by the model, as ops will read it."""
    required = {name for name, field in StackOutputs.model_fields.items()
                if field.is_required() or name == "version"}
    base = program_outputs(stack)
    document = {key: value for key, value in base.items()
                if key in {StackOutputs.model_fields[name].alias for name in required}}
    # The fake's own nodes and groups, never the shipped stack's beside them.
    document["groups"] = {}
    document["nodes"] = {}
    for role, entry in (partial.get("containers") or {}).items():
        document["nodes"].setdefault(entry["node"], {"roles": []})["roles"].append(role)
    document |= partial
    StackOutputs.model_validate(document)
    return document
