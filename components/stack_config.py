"""Reads the stack's `kimipd:*` values from the Pulumi runtime, as plain data for the model."""

from __future__ import annotations

import difflib
import json
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config
from pydantic import BaseModel

from .config import CONFIG_NAMESPACE, SECRET_KEYS, ClusterConfig, ConfigError, shown_value

# Namespaces something in this program reads: its own, its providers' and Pulumi's. A key under
# any other (a misspelt `kimpdi:serving`) is read by nothing.
READ_NAMESPACES = (CONFIG_NAMESPACE, "command", "docker", "pulumi")


def _decode(value: Any) -> Any:
    # Structured values arrive as JSON text; plain strings (an image name) do not parse.
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _stack_keys() -> list[str]:
    """Every config key set for the stack, `namespace:name`."""
    return sorted(set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env()))


def _is_secret(key: str) -> bool:
    return (runtime_config.is_config_secret(key)
            or key in runtime_config.get_config_secret_keys_env())


def stack_config_values(namespace: str = CONFIG_NAMESPACE,
                        secret_keys: frozenset[str] = SECRET_KEYS) -> dict[str, Any]:
    """Every `NAMESPACE:*` key set for the stack, so a misspelt key is caught. Secrets are left
    out: they never enter the model (check_stack_secrets refuses the misplaced ones)."""
    prefix = namespace + ":"
    values = {}
    for key in _stack_keys():
        if key.startswith(prefix) and not _is_secret(key) and key[len(prefix):] not in secret_keys:
            values[key[len(prefix):]] = _decode(runtime_config.get_config(key))
    return values


def check_stack_secrets(namespace: str = CONFIG_NAMESPACE, model: type[BaseModel] = ClusterConfig,
                        secret_keys: frozenset[str] = SECRET_KEYS) -> None:
    """Refuse a secret written in plain text, and a secret the program would never read.

    A value is never quoted: it may be a private key. NAMESPACE, MODEL, SECRET_KEYS: the
    project's (the observability project has its own).
    """
    prefix = namespace + ":"
    model_keys = [field.alias or name for name, field in model.model_fields.items()]
    problems = []
    for key in _stack_keys():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if name in secret_keys and not _is_secret(key):
            problems.append(
                f"{name}: set in plain text (value not shown), so the "
                f"{'API key' if name in ('routerApiKey', 'adminApiKey') else 'private key'} sits "
                "unencrypted in Pulumi.<stack>.yaml and in every copy of that file: remove it "
                f"(`pulumi config rm {name}`) and set it as a secret: `pulumi config set --secret "
                f"{name} < KEYFILE`.")
        elif name in model_keys and _is_secret(key):
            problems.append(
                f"{name}: set as a secret (value not shown), but the program reads {name} as "
                f"plain configuration: set it again without --secret (`pulumi config set {name} "
                "...`).")
        elif name not in secret_keys and _is_secret(key):
            close = difflib.get_close_matches(name, sorted(secret_keys), n=1, cutoff=0.6)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            target = close[0] if close else "sshPrivateKey"
            problems.append(
                f"{name}: a secret (value not shown) that this program never reads{guess}: "
                f"remove it (`pulumi config rm {name}`) and set `pulumi config set --secret "
                f"{target} < KEYFILE`.")
    if problems:
        raise ConfigError(f"invalid {namespace} secrets:\n  " + "\n  ".join(problems))


def stack_config_warnings(namespace: str = CONFIG_NAMESPACE) -> list[str]:
    """Keys under a namespace nothing reads: deployable, but the key is silently ignored."""
    read = (namespace, *READ_NAMESPACES[1:])
    warnings = []
    for key in _stack_keys():
        found, _, name = key.partition(":")
        if found in read:
            continue
        close = difflib.get_close_matches(found, read, n=1, cutoff=0.5)
        target = f"{close[0] if close else namespace}:{name}"
        shown = ("value not shown" if _is_secret(key)
                 else f"value {shown_value(runtime_config.get_config(key))}")
        guess = f" (did you mean {target}?)" if close else ""
        warnings.append(
            f"{key}: namespace {found!r} is read by neither this program ({namespace}) "
            f"nor its providers (command, docker) nor Pulumi, so this key ({shown}) is ignored"
            f"{guess}: move it (`pulumi config rm '{key}'`, then `pulumi config set {target} "
            "...`) or remove it.")
    return warnings


def ssh_private_key(namespace: str = CONFIG_NAMESPACE) -> pulumi.Output[str] | None:
    return pulumi.Config(namespace).get_secret("sshPrivateKey")


ROUTER_API_KEY = "routerApiKey"


def router_api_key(cfg: ClusterConfig) -> pulumi.Output[str] | None:
    """The Rust router's API key (a secret): it guards the worker API and /generate. Required with
    router.kind rust, whose worker API would otherwise let anyone who reaches the port add or
    remove workers."""
    if cfg.router.kind != "rust":
        return None
    return _required_secret(
        ROUTER_API_KEY, "router.kind 'rust' serves a worker API (add, remove workers) and "
        "/generate to whoever reaches router.port, and every SGLang server requires the same key: "
        f"set one, `openssl rand -hex 32 | pulumi config set --secret {ROUTER_API_KEY}` (clients "
        "then send `Authorization: Bearer KEY`).")


ADMIN_API_KEY = "adminApiKey"


def admin_api_key(cfg: ClusterConfig) -> pulumi.Output[str] | None:
    """SGLang's admin routes' own key (a secret, optional): with it they no longer take the key
    the routers send (routerApiKey), only this one. Only the keyed servers of the rust router
    have admin routes to guard."""
    key = pulumi.Config(CONFIG_NAMESPACE).get_secret(ADMIN_API_KEY)
    if key is not None and not cfg.workers_keyed:
        raise ConfigError(
            f"invalid kimipd secrets:\n  {ADMIN_API_KEY}: set, but with router.kind "
            f"{cfg.router.kind!r} the SGLang servers run without keys, so there is nothing for "
            f"it to guard: set router.kind rust, or `pulumi config rm {ADMIN_API_KEY}`.")
    return key


def _required_secret(name: str, why_and_fix: str) -> pulumi.Output[str]:
    """The secret NAME; unset, a ConfigError saying why the stack needs it and how to set it."""
    key = pulumi.Config(CONFIG_NAMESPACE).get_secret(name)
    if key is None:
        raise ConfigError(f"invalid kimipd secrets:\n  {name}: not set, and {why_and_fix}")
    return key


DOOR_TLS_KEY = "doorTlsKey"


def door_tls_key(cfg: ClusterConfig) -> pulumi.Output[str] | None:
    """The door's TLS private key (a secret, PEM), read only when router.door.tls is set."""
    door = cfg.router.door
    if door is None or door.tls is None:
        return None
    return _required_secret(
        DOOR_TLS_KEY, "router.door.tls names a certificate the door cannot serve without its key: "
        f"set it, `pulumi config set --secret {DOOR_TLS_KEY} < door.key` (PEM), or remove "
        "router.door.tls to serve plain HTTP.")
