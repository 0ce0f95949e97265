"""The systemd unit that runs `reconcile --watch` on the operator's host: systemd's own verifier
accepts it, its command line parses with the real CLI, and the passphrase stays out of it. The
engine test (tests/integration/test_heal.py) runs its ExecStart as written."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ops import USAGE
from ops.cli import build_parser, main
from tests.conftest import REPO
from tests.ops.systemd_unit import ENV_EXAMPLE, UNIT, environment_file, exec_start, unit_text


def test_systemd_analyze_verify_accepts_the_unit(tmp_path) -> None:
    assert shutil.which("systemd-analyze"), "scripts/test installs systemd (systemd-analyze)"
    instance = tmp_path / "kimipd-reconcile@sim.service"
    instance.write_text(unit_text())
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(instance)],
                            capture_output=True, text=True, timeout=60)
    # An unknown key is only a warning to systemd: any output fails the test.
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), \
        result.stdout + result.stderr


def test_the_verifier_refuses_a_broken_unit(tmp_path) -> None:
    """The check above can fail: a misspelt key and a missing program are reported."""
    instance = tmp_path / "kimipd-reconcile@sim.service"
    instance.write_text(unit_text().replace("KillMode=", "KilMode=").replace(
        str(REPO / "scripts" / "kimipd"), "/nonexistent/kimipd"))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(instance)],
                            capture_output=True, text=True, timeout=60)
    assert "KilMode" in result.stderr and "/nonexistent/kimipd" in result.stderr


def test_exec_start_with_the_example_environment_parses_with_the_real_cli() -> None:
    environment = environment_file(ENV_EXAMPLE.read_text())
    words = exec_start("pro6000", environment)
    assert words[0] == str(REPO / "scripts" / "kimipd")
    args = build_parser().parse_args(words[1:])
    assert (args.command, args.stack, args.watch) == ("reconcile", "pro6000", True)
    # The environment file's options come last and win over the unit's.
    assert (args.interval, args.grace_seconds, args.max_heals_per_hour) == (30, 60, 3)
    assert str(args.state_file) == "/var/lib/kimipd/reconcile-pro6000.json"


def test_the_passphrase_lives_in_the_environment_file_only() -> None:
    environment = environment_file(ENV_EXAMPLE.read_text())
    assert "PULUMI_CONFIG_PASSPHRASE" in environment
    text = UNIT.read_text()
    assert "PASSPHRASE" not in text and "ACCESS_TOKEN" not in text
    assert "EnvironmentFile=/etc/kimipd/reconcile-%i.env" in text
    # SIGTERM to reconcile alone, so a heal under way finishes its `up`.
    assert "KillMode=mixed" in text


def test_bad_limits_are_refused_before_anything_runs(capsys) -> None:
    assert main(["-s", "x", "reconcile", "--max-heals-per-hour", "0"]) == USAGE
    assert "--max-heals-per-hour 0: must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main(["-s", "x", "reconcile", "--interval", "0"])
    assert refused.value.code == USAGE
    assert "--interval: '0' is not a positive number" in capsys.readouterr().err
