"""The stack's configuration as one typed, validated model.

Stack YAML (`kimipd:*` keys) -> `ClusterConfig`. Everything below this package reads the model,
never `pulumi.Config`. Where to look:
- `schema.py`: the sections of a stack file (NodeSpec, GroupSpec, ...), `router_schema.py` the
  router's and the door's (RouterSpec, DoorSpec);
  `cluster_config.py`: ClusterConfig, which holds them, and its derived views;
- `rules/`: every check across fields, one module per family: `runbook.py` (the runbook's hard
  rules), `topology.py` (nodes, groups, GPUs), `ports.py`, `files.py` (node files, mounts, the
  model path), `extra_args.py` (extraArgs against the real option tables), `router.py`,
  `door.py` (the door on two nodes and its virtual IP), `gates.py`;
- `grammars.py`: values docker and ssh accept (image references, host keys, ulimits);
- `messages.py`: pydantic's errors turned into key, value and fix; `load.py`: stack files;
- `warnings.py`: what preview warns about; `placeholders.py`: what a shipped stack file leaves
  for the operator, refused by the program until it is filled in.
"""

from .base import ConfigError
from .cluster_config import ClusterConfig
from .load import (
                   CONFIG_NAMESPACE,
                   SECRET_KEYS,
                   load_cluster_config,
                   read_stack_file,
                   stack_file_values,
)
from .messages import shown_value
from .placeholders import placeholder_refusals
from .rules.runbook import MOONCAKE_WHEEL_PREFIX, parse_mooncake_version
from .schema import ConnectionSpec, GroupSpec, NodeFileSpec, NodeSpec, VerificationSpec
from .warnings import config_warnings, out_node_notes

__all__ = [
    "CONFIG_NAMESPACE",
    "SECRET_KEYS",
    "MOONCAKE_WHEEL_PREFIX",
    "ClusterConfig",
    "ConfigError",
    "ConnectionSpec",
    "GroupSpec",
    "NodeFileSpec",
    "NodeSpec",
    "VerificationSpec",
    "config_warnings",
    "out_node_notes",
    "placeholder_refusals",
    "load_cluster_config",
    "parse_mooncake_version",
    "read_stack_file",
    "shown_value",
    "stack_file_values",
]
