"""The operator tools' one way to Pulumi: the Automation API's LocalWorkspace on the project
directory, with the pulumi CLI on PATH and the caller's backend and passphrase
(PULUMI_BACKEND_URL, PULUMI_CONFIG_PASSPHRASE / PULUMI_ACCESS_TOKEN), as the operator's own
`pulumi` would. `StackReader` reads a stack (no program runs); ops/stack_engine.py's StackEngine
previews, refreshes and updates it. A command the API has no method for runs through the
workspace's public CLI runner (`run_cli`); every failure is a StackError."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pulumi import automation as auto

from .errors import StackError

T = TypeVar("T")

NO_CLI = ("the pulumi CLI is not on PATH: install it, or source the env file "
          "scripts/install-pulumi writes (~/.cache/kimipd/pulumi/env)")


def run_cli(workspace: auto.LocalWorkspace, args: Sequence[str]) -> auto.CommandResult:
    """A pulumi command the Automation API has no method for, run as its own are: by the
    workspace's CLI, in its directory, with its PULUMI_HOME and environment."""
    if workspace.pulumi_command is None:
        raise StackError("the Automation API's workspace has no pulumi CLI")
    env = {"PULUMI_HOME": workspace.pulumi_home} if workspace.pulumi_home else {}
    return workspace.pulumi_command.run(list(args), workspace.work_dir,
                                        env | dict(workspace.env_vars or {}))


def engine_failure(what: str, error: auto.CommandError) -> StackError:
    """ERROR of the command that WHAT names, as the one error type (its stderr's tail)."""
    text = str(error).strip()
    return StackError(f"`pulumi {what}` failed: {text[-2000:]}")


class Workspace(auto.LocalWorkspace):
    """Finds the stack without selecting it: `pulumi stack select` is the operator's global
    state, and a person's next `pulumi up` without `-s` would act on the stack ops chose.
    Every command the Stack runs names its stack (`--stack`)."""

    def select_stack(self, stack_name: str) -> None:
        run_cli(self, ["stack", "--stack", stack_name])


class ReadingWorkspace(Workspace):
    """For reading alone: no command to find the stack, whose first read says when there is no
    such stack (a status or a `--watch` pass runs no more pulumi commands than its reads)."""

    def select_stack(self, stack_name: str) -> None:
        pass


def open_workspace(project_dir: Path, program: Callable[[], None] | None = None,
                   reading: bool = False) -> Workspace:
    if shutil.which("pulumi") is None:
        raise StackError(NO_CLI)
    kind = ReadingWorkspace if reading else Workspace
    return kind(work_dir=str(project_dir), program=program)


def select(workspace: Workspace, stack: str | None) -> auto.Stack:
    """STACK, or the operator's selected stack when none is named."""
    try:
        if stack is None:
            summary = workspace.stack()
            if summary is None:
                raise StackError("no stack is selected and none is named: name one with "
                                 "-s STACK (`pulumi stack ls` lists them)")
            stack = summary.name
        return auto.Stack.select(stack, workspace)
    except auto.CommandError as error:
        raise engine_failure(f"stack --stack {stack}", error) from None


class StackReader:
    """One stack's outputs (secrets masked), config (a secret's value held in memory only, for
    the connection) and state, read through the Automation API; no program runs."""

    def __init__(self, stack: str | None, project_dir: Path) -> None:
        self.stack = select(open_workspace(project_dir, reading=True), stack)

    @property
    def name(self) -> str:
        return self.stack.name

    def _read(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except auto.CommandError as error:
            raise engine_failure(what, error) from None

    def outputs(self) -> dict[str, Any]:
        """As `pulumi stack output --json` prints them: a secret is `[secret]`."""
        found = self._read("stack output", self.stack.outputs)
        return {key: "[secret]" if value.secret else value.value for key, value in found.items()}

    def config(self) -> Mapping[str, auto.ConfigValue]:
        return self._read("config", self.stack.get_all_config)

    def export(self) -> dict[str, Any]:
        """The state as `pulumi stack export` has it."""
        deployment = self._read("stack export", self.stack.export_stack)
        return {"version": deployment.version, "deployment": deployment.deployment or {}}
