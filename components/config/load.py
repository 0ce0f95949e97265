"""Loading: a stack file's `kimipd:*` values into a validated ClusterConfig, or a ConfigError."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .base import CONFIG_NAMESPACE, ConfigError
from .cluster_config import ClusterConfig
from .messages import validation_problems

# Keys read with `Config.get_secret`; they never enter the model (and so never enter a rendering).
SECRET_KEYS = frozenset({"sshPrivateKey", "routerApiKey", "adminApiKey", "doorTlsKey"})


def load_cluster_config(raw: Mapping[str, Any]) -> ClusterConfig:
    """Validate the `kimipd:*` config values (namespace stripped); raise ConfigError on any
    problem."""
    try:
        return ClusterConfig.model_validate(dict(raw))
    except ValidationError as error:
        lines = validation_problems(error)
        raise ConfigError("invalid kimipd stack configuration:\n  " + "\n  ".join(lines)) from None


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `kimipd:*` values of a `Pulumi.<stack>.yaml` file (see stack_file_values)."""
    return stack_file_values(yaml.safe_load(path.read_text()))


def stack_file_values(stack_yaml: Mapping[str, Any]) -> dict[str, Any]:
    """The `kimipd:*` values of a parsed `Pulumi.<stack>.yaml`, namespace stripped, secrets left
    out."""
    prefix = CONFIG_NAMESPACE + ":"
    values = {}
    for key, value in (stack_yaml.get("config") or {}).items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if name not in SECRET_KEYS:
            values[name] = value
    return values
