"""The reconcile service's unit file read as systemd reads it, for tests that run its ExecStart
where no systemd is PID 1 (this machine, CI)."""

from __future__ import annotations

import shlex

from tests.conftest import REPO

UNIT = REPO / "ops" / "systemd" / "kimipd-reconcile@.service"
ENV_EXAMPLE = REPO / "ops" / "systemd" / "reconcile.env.example"
# The environment systemd gives a service with User=root, before its EnvironmentFile.
SERVICE_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOME": "/root", "USER": "root", "LOGNAME": "root"}


def unit_text() -> str:
    """The unit with /opt/kimipd (where docs/healing.md installs the repository) as this one."""
    return UNIT.read_text().replace("/opt/kimipd", str(REPO))


def environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines; comments and blank lines skipped, surrounding quotes removed."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip().strip('"')
    return values


def exec_start(instance: str, environment: dict[str, str]) -> list[str]:
    """ExecStart as systemd runs it: %i is the instance, an unbraced $VAR the environment's
    value split on whitespace."""
    line = next(line for line in unit_text().splitlines() if line.startswith("ExecStart="))
    words = []
    for word in shlex.split(line[len("ExecStart="):].replace("%i", instance)):
        if word.startswith("$"):
            words += environment.get(word[1:], "").split()
        else:
            words.append(word)
    return words
