"""The engine operations `kimipd reconcile` runs on one stack, through the Automation API with the
pulumi CLI on PATH and the caller's backend and passphrase (PULUMI_BACKEND_URL,
PULUMI_CONFIG_PASSPHRASE / PULUMI_ACCESS_TOKEN), as the operator's own `pulumi` would.

The program runs inline (this process runs `__main__.py` in the project directory), so no
language-host binary is needed beyond what `kimipd status` needs; the stack file, state and
plugins are the operator's."""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, chdir
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml
from pulumi import automation as auto

from .policy_pack import PolicyRun, policy_run, stack_policy_file
from .pulumi_workspace import open_workspace, run_cli, select
from .stack import REPO, config_values
from .stack_engine_types import UpdateEntry
from .state_urns import container_urns


class StackLocked(Exception):
    """Another update holds the stack (the engine refused to start ours)."""


class HealFailed(Exception):
    """The heal's refresh or up failed; FAILURES says which resources and why."""

    def __init__(self, output: str, failures: list[dict[str, str]]) -> None:
        super().__init__(output)
        self.failures = failures


# The engine's own summary lines, which name no resource's reason.
_ENGINE_NOISE = ("update failed", "refresh failed", "preview failed")


def failures_from_events(events: list[auto.EngineEvent]) -> list[dict[str, str]]:
    """Each resource whose step failed, with the error lines its provider gave (the last 1500
    characters: a remote command's error ends with its stderr), in the order they failed; and
    each resource the policy pack refused (mandatory), with the policy and its message."""
    found: dict[str, dict[str, str]] = {}
    for event in events:
        violation = event.policy_event
        if (violation is not None and violation.enforcement_level == "mandatory"
                and violation.resource_urn):
            entry = found.setdefault(violation.resource_urn, {
                "resource": violation.resource_urn.rsplit("::", 1)[-1],
                "type": violation.resource_urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1],
                "error": ""})
            entry["error"] = (entry["error"] + f"\npolicy {violation.policy_name} (mandatory): "
                              + violation.message.strip()).strip()[-1500:]
            continue
        diagnostic = event.diagnostic_event
        if diagnostic is None or diagnostic.severity != "error" or not diagnostic.urn:
            continue
        text = diagnostic.message.strip()
        if not text or text.lower() in _ENGINE_NOISE:
            continue
        entry = found.setdefault(diagnostic.urn, {
            "resource": diagnostic.urn.rsplit("::", 1)[-1],
            "type": diagnostic.urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1],
            "error": ""})
        entry["error"] = (entry["error"] + "\n" + text).strip()[-1500:]
    return list(found.values())


def file_backend_locks(backend_url: str | None, project: str, stack: str) -> list[str]:
    """The lock files a file:// backend holds for STACK (pulumi's diy backend writes one per
    running update, under .pulumi/locks/organization/PROJECT/STACK/); other backends answer
    only when an update is refused, so they give none here."""
    if not backend_url or not backend_url.startswith("file://"):
        return []
    parts = urlsplit(backend_url)
    root = Path(unquote(parts.path))
    if parts.netloc == "~":  # file://~/state
        root = Path.home() / unquote(parts.path).lstrip("/")
    directory = root / ".pulumi" / "locks" / "organization" / project / stack
    holders = []
    for lock in sorted(directory.glob("*.json")):
        try:
            content = json.loads(lock.read_text())
        except (OSError, ValueError):
            content = {}
        holders.append(f"{content.get('username', '?')}@{content.get('hostname', '?')} pid "
                       f"{content.get('pid', '?')} since {content.get('timestamp', '?')}")
    return holders


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """A digest of the stack's config with every secret's value left out."""
    canonical = {key: ("<secret>" if value.get("secret") else value.get("value"))
                 for key, value in sorted(config.items())}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:16]


def _summary(entry: auto.UpdateSummary) -> UpdateEntry:
    return UpdateEntry(kind=entry.kind, message=entry.message or "",
                       started=entry.start_time.timestamp(),
                       ended=entry.end_time.timestamp() if entry.end_time else None,
                       result=entry.result)


class StackEngine:
    def __init__(self, stack: str | None, project_dir: Path,
                 on_event: Callable[[auto.EngineEvent], None] | None = None) -> None:
        """ON_EVENT also sees every engine event of a heal's refresh and up (the bench draws
        them, bench/availability.py)."""
        self.project_dir = project_dir.resolve()
        self.on_event = on_event
        self.project = yaml.safe_load((self.project_dir / "Pulumi.yaml").read_text())["name"]
        self.workspace = open_workspace(self.project_dir, self._program)
        self.stack = select(self.workspace, stack)

    def _program(self) -> None:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        with chdir(self.project_dir):
            runpy.run_path(str(REPO / "__main__.py"), run_name="__main__")

    def locks(self) -> list[str]:
        return file_backend_locks(os.environ.get("PULUMI_BACKEND_URL"), self.project,
                                  self.stack.name)

    def history(self, entries: int = 20) -> list[UpdateEntry]:
        """The newest first."""
        return [_summary(entry) for entry in
                self.stack.history(page_size=entries, show_secrets=False)]

    def config_fingerprint(self) -> str:
        config = self.stack.get_all_config()
        return config_fingerprint({key: {"value": value.value, "secret": value.secret}
                                   for key, value in config.items()})

    def config_values(self) -> dict[str, Any]:
        """The stack's `kimipd:` config, namespace stripped, secrets left out."""
        return config_values({key: {"value": value.value, "secret": value.secret}
                              for key, value in self.stack.get_all_config().items()})

    def policy(self) -> AbstractContextManager[PolicyRun]:
        """The policy pack, told this stack's config: every preview and up names it."""
        return policy_run(self.config_values(),
                          operator_file=stack_policy_file(self.project_dir, self.stack.name))

    def pending_steps(self) -> dict[str, int]:
        """What `pulumi preview` (no refresh) would do: the config against the state. A stack
        that converged previews every resource `same`."""
        result = self.stack.preview()
        return {op: count for op, count in (result.change_summary or {}).items()
                if op != "same" and count}

    def delete_from_state(self, urns: Sequence[str]) -> None:
        """`pulumi state delete` of URNS in their order (children before parents: a parent with
        a child still in the state is refused), contacting nothing."""
        if urns:
            run_cli(self.workspace, ["state", "delete", *urns, "--yes", "--force",
                                     "--stack", self.stack.name])

    def container_urns(self, containers: Iterable[tuple[str, str]]) -> list[str]:
        """The state's URNs of the containers named by (node, container name)."""
        return container_urns({"deployment": self.stack.export_stack().deployment}, containers)

    def heal(self, message: str, replace: Sequence[str] = ()) -> dict[str, int]:
        """`pulumi refresh` (the dead containers drift) then `pulumi up` (their groups are
        replaced whole, gated, admitted, smoke-tested), replacing REPLACE too (a hung unit's
        containers, which run and so do not drift). Returns up's step counts; a failure
        raises HealFailed with the resources that failed and their error lines."""
        events: list[auto.EngineEvent] = []

        def seen(event: auto.EngineEvent) -> None:
            events.append(event)
            if self.on_event is not None:
                self.on_event(event)

        try:
            self.stack.refresh(message=message, show_secrets=False, on_event=seen)
            with self.policy() as policy:
                result = self.stack.up(message=message, show_secrets=False, on_event=seen,
                                       replace=list(replace) or None,
                                       policy_packs=policy.packs,
                                       policy_pack_configs=policy.configs)
        except auto.ConcurrentUpdateError as error:
            raise StackLocked(str(error).strip().splitlines()[-1][:300]) from None
        except auto.CommandError as error:
            raise HealFailed(str(error), failures_from_events(events)) from None
        return {op: count for op, count in (result.summary.resource_changes or {}).items()}


def engine_error_hint(message: str) -> str | None:
    """What to do about an engine error an operator cannot read off its text, or None."""
    if "failed to load checkpoint: EOF" in message:
        # gocloud's file blobs write a checkpoint by rename but its attributes file in place: a
        # `pulumi` killed at that moment leaves the latter empty, and no command loads the stack.
        return ("a killed `pulumi` left the stack's checkpoint attributes file empty (a file "
                "backend's .pulumi/stacks/PROJECT/STACK.json.attrs): remove that empty file (the "
                "checkpoint STACK.json is whole), then `pulumi cancel` and go on as after any "
                "killed `up` (docs/troubleshooting.md)")
    return None

