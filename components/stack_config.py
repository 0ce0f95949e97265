"""Reads the stack's `kimipd:*` values from the Pulumi runtime, as plain data for the model."""

from __future__ import annotations

import json
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from .config import CONFIG_NAMESPACE, SECRET_KEYS


def _decode(value: Any) -> Any:
    # Structured values arrive as JSON text; plain strings (an image name) do not parse.
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def stack_config_values() -> dict[str, Any]:
    """Every `kimipd:*` key set for the stack (secrets left out), so a misspelt key is caught."""
    prefix = CONFIG_NAMESPACE + ":"
    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    values = {}
    for key in sorted(keys):
        if key.startswith(prefix) and key[len(prefix):] not in SECRET_KEYS:
            values[key[len(prefix):]] = _decode(runtime_config.get_config(key))
    return values


def ssh_private_key() -> pulumi.Output[str] | None:
    return pulumi.Config(CONFIG_NAMESPACE).get_secret("sshPrivateKey")
