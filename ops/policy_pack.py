"""The policy pack (policy/) on every update ops makes: `kimipd up` and `kimipd preview`, and every
heal `kimipd reconcile` runs. On a file backend a pack runs only where a command names it, so each
of these names it; a mandatory violation stops the update before any resource is touched.

The pack is told the stack's own management interface (`kimipd:network.managementInterface`),
so its NCCL/GLOO rule judges the interface this stack keeps off the compute path; a file
`Pulumi.STACK.policy.json` beside the stack file, when there is one, adds to or overrides that
per policy (`{"kimipd-no-privileged": {"allowPrivileged": true}}`), as `--policy-pack-config`
would."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from components.config.schema import NetworkSpec

from .stack import REPO, StackError

POLICY_PACK = REPO / "policy"
# README's command (policy/PulumiPolicy.yaml's `virtualenv: venv`).
POLICY_VENV_COMMAND = ("python3 -m venv policy/venv && "
                       "policy/venv/bin/pip install -r policy/requirements.txt")


class PolicyPackMissing(StackError):
    """The pack cannot run: its virtualenv is not made."""


@dataclass(frozen=True)
class PolicyRun:
    """What the Automation API's `preview` and `up` take to run the pack."""

    packs: list[str]
    configs: list[str]


def pack_config(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The pack's config for a stack of config VALUES (`kimipd:` keys, namespace stripped)."""
    network = values.get("network")
    try:
        spec = NetworkSpec.model_validate(network if isinstance(network, Mapping) else {})
    except ValidationError as error:
        raise StackError(f"kimipd:network: {error}") from None
    return {"kimipd-nccl-off-management": {"managementInterface": spec.management_interface}}


def require_pack(pack: Path | None = None) -> Path:
    """The pack's directory, once its virtualenv is made."""
    pack = pack or POLICY_PACK
    if not (pack / "venv" / "bin" / "python").exists():
        raise PolicyPackMissing(
            f"the policy pack {pack} has no virtualenv ({pack / 'venv'} is missing), and every "
            f"update runs it: make it once with `{POLICY_VENV_COMMAND}` in the repository "
            "(docs/air-gapped.md for a host without PyPI)")
    return pack


def stack_policy_file(project_dir: Path, stack: str) -> Path:
    """The operator's own config of the pack for STACK, beside its stack file."""
    return project_dir / f"Pulumi.{stack}.policy.json"


def operator_config(path: Path) -> dict[str, dict[str, Any]]:
    """PATH's policies and their settings ({} without the file), or a StackError naming it."""
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise StackError(f"{path}: not JSON the policy pack takes ({error}); it maps a "
                         'policy to its settings: {"kimipd-no-privileged": '
                         '{"allowPrivileged": true}}') from None
    if not isinstance(document, dict) or not all(isinstance(entry, dict)
                                                  for entry in document.values()):
        raise StackError(f"{path}: maps a policy to its settings: "
                         '{"kimipd-no-privileged": {"allowPrivileged": true}}')
    return document


@contextmanager
def policy_run(values: Mapping[str, Any], pack: Path | None = None,
               operator_file: Path | None = None) -> Iterator[PolicyRun]:
    """The pack and this stack's config for it (OPERATOR_FILE's settings over the derived ones),
    in a file that lives as long as the update."""
    pack = require_pack(pack)
    config = pack_config(values)
    for policy, settings in (operator_config(operator_file) if operator_file else {}).items():
        config[policy] = config.get(policy, {}) | settings
    with tempfile.TemporaryDirectory(prefix="kimipd-policy-") as directory:
        path = Path(directory) / "policy-config.json"
        path.write_text(json.dumps(config, indent=2))
        yield PolicyRun(packs=[str(pack)], configs=[str(path)])
