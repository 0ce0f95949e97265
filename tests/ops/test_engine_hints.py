"""`kimipd up` / `preview` name the recovery for an engine error whose text does not say it."""

from __future__ import annotations

import pytest
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult

from ops import DOWN
from ops.cli import main
from ops.stack_engine import engine_error_hint

EMPTY_ATTRS = "\n code: 1\n stdout: \n stderr: error: failed to load checkpoint: EOF"


class Refused:
    """An OutUpdate whose engine answers as one a killed `pulumi` left behind."""

    def __init__(self, engine: object) -> None:
        pass

    def up(self, *args: object) -> int:
        raise auto.CommandError(CommandResult(stdout="", code=1,
                                              stderr="error: failed to load checkpoint: EOF"))


def test_an_empty_checkpoint_attributes_file_is_named_with_its_recovery(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("ops.engine_cli.StackEngine", lambda stack, cwd: None)
    monkeypatch.setattr("ops.engine_cli.OutUpdate", Refused)
    assert main(["-s", "sim", "up", "--yes"]) == DOWN
    error = capsys.readouterr().err
    assert "failed to load checkpoint: EOF" in error
    assert "STACK.json.attrs): remove that empty file" in error, error
    assert "docs/troubleshooting.md" in error


def test_other_errors_get_no_hint() -> None:
    assert engine_error_hint(EMPTY_ATTRS) is not None
    assert engine_error_hint("error: the stack is currently locked by 1 lock(s)") is None
