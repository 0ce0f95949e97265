"""What the operator tools know about a stack: its outputs (the topology) and the connection
settings of its config, read through the pulumi CLI, or from files a test injects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from components.config import (
    CONFIG_NAMESPACE,
    ConfigError,
    ConnectionSpec,
    NodeSpec,
    VerificationSpec,
    load_cluster_config,
)
from components.config.router_schema import DEFAULT_ROUTER_KIND
from components.render import container_roles

from .errors import StackError
from .pulumi_workspace import StackReader
from .topology import Topology

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Access:
    """How to reach the nodes: the program's own connection settings."""

    known_hosts_file: str | None
    nodes: Mapping[str, NodeSpec]
    # The `sshPrivateKey` secret, held in memory only (never printed, never an argument).
    private_key: str | None = field(default=None, repr=False)

    def node(self, address: str) -> NodeSpec:
        return self.nodes.get(address) or NodeSpec(address=address)


@dataclass(frozen=True)
class DoorTlsConfig:
    certificate: str | None = None
    ca_certificate: str | None = None


@dataclass(frozen=True)
class Stack:
    topology: Topology
    access: Access
    verification: VerificationSpec
    # Every container role the config defines (components/render/naming.py); none when the
    # config does not validate, and why (`roles_problem`).
    roles: frozenset[str] = frozenset()
    roles_problem: str | None = None
    # The rust router's key (the secret routerApiKey), for requests sent from here.
    router_api_key: str | None = None
    # The config's `serving` (false: nothing is meant to run, even before an `up` applies it).
    serving_config: bool = True
    # router.kind (the schema's default when the config does not say).
    router_kind: str = DEFAULT_ROUTER_KIND
    # router.door.tls of the config, when there is one: what the door's certificate is checked
    # against (the CA is not among the outputs).
    door_tls: DoorTlsConfig | None = None


def router_config(values: Mapping[str, Any]) -> Mapping[str, Any]:
    router = values.get("router")
    return router if isinstance(router, Mapping) else {}


def door_tls_from_config(values: Mapping[str, Any]) -> DoorTlsConfig | None:
    door = router_config(values).get("door")
    tls = door.get("tls") if isinstance(door, Mapping) else None
    if not isinstance(tls, Mapping):
        return None
    certificate, ca = tls.get("certificate"), tls.get("caCertificate")
    return DoorTlsConfig(certificate=certificate if isinstance(certificate, str) else None,
                         ca_certificate=ca if isinstance(ca, str) else None)


def _pulumi_entry(entry: Any) -> bool:
    """An entry of `pulumi config --json`: {"value", "objectValue"?, "secret"}."""
    return (isinstance(entry, Mapping) and "secret" in entry
            and set(entry) <= {"value", "objectValue", "secret"})


def config_values(pulumi_config: Mapping[str, Any]) -> dict[str, Any]:
    """`kimipd:*` values of `pulumi config --json` (or of a plain {key: value} map), namespace
    stripped, secrets left out."""
    prefix = CONFIG_NAMESPACE + ":"
    values = {}
    for key, entry in pulumi_config.items():
        name = key[len(prefix):] if key.startswith(prefix) else key
        if _pulumi_entry(entry):
            if entry["secret"]:
                continue
            if "objectValue" in entry:
                entry = entry["objectValue"]
            else:
                # Structured values set without --path arrive as JSON text.
                try:
                    entry = json.loads(entry.get("value"))
                except (TypeError, json.JSONDecodeError):
                    entry = entry.get("value")
        values[name] = entry
    return values


def access_from_config(values: Mapping[str, Any], private_key: str | None = None) -> Access:
    try:
        connection = ConnectionSpec.model_validate(values.get("connection") or {})
        nodes = [NodeSpec.model_validate(node) for node in values.get("nodes") or []]
    except ValidationError as error:
        raise StackError(f"kimipd:connection / kimipd:nodes: {error}") from None
    return Access(known_hosts_file=connection.known_hosts_file,
                  nodes={node.address: node for node in nodes}, private_key=private_key)


def roles_from_config(values: Mapping[str, Any]) -> tuple[frozenset[str], str | None]:
    """Every container role the config defines, as the program names them
    (components/render/naming.py), or none and why, when the config does not validate: then no
    container can be judged this stack's."""
    try:
        return container_roles(load_cluster_config(values)), None
    except ConfigError as error:
        return frozenset(), str(error)


def verification_from_config(values: Mapping[str, Any]) -> VerificationSpec:
    try:
        return VerificationSpec.model_validate(values.get("verification") or {})
    except ValidationError as error:
        raise StackError(f"kimipd:verification: {error}") from None


def secret_value(config: Mapping[str, Any], key: str) -> str | None:
    """The value of `kimipd:KEY` when the config holds it as a secret (never a plain one)."""
    entry = config.get(f"{CONFIG_NAMESPACE}:{key}")
    return entry.value if entry is not None and entry.secret else None


def load_stack(stack: str | None, cwd: Path = REPO, outputs_file: Path | None = None,
               config_file: Path | None = None) -> Stack:
    """The stack's outputs and connection settings; files replace the engine (tests)."""
    name = stack or "injected"
    outputs = json.loads(Path(outputs_file).read_text()) if outputs_file is not None else None
    raw_config = json.loads(Path(config_file).read_text()) if config_file is not None else None
    private_key = router_key = None
    if outputs is None or raw_config is None:
        reader = StackReader(stack, cwd)
        name = reader.name
        if outputs is None:
            outputs = reader.outputs()
        if raw_config is None:
            config = reader.config()
            raw_config = {key: {"value": value.value, "secret": value.secret}
                          for key, value in config.items()}
            private_key = secret_value(config, "sshPrivateKey")
            router_key = secret_value(config, "routerApiKey")
            router_key = router_key.strip() if router_key is not None else None
    values = config_values(raw_config)
    roles, roles_problem = roles_from_config(values)
    return Stack(topology=Topology.from_outputs(name, outputs),
                 access=access_from_config(values, private_key),
                 verification=verification_from_config(values),
                 roles=roles,
                 roles_problem=roles_problem,
                 router_api_key=router_key,
                 serving_config=values.get("serving", True) not in (False, "false"),
                 router_kind=str(router_config(values).get("kind") or DEFAULT_ROUTER_KIND),
                 door_tls=door_tls_from_config(values))
