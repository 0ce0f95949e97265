"""The real Pulumi engine, driven through the Automation API on a file backend.

The program runs inline (the SDK's in-process language server runs `__main__.py`), so no
`pulumi-language-python` binary is needed; everything else is the real CLI and engine.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto

from tests.conftest import REPO


def engine_env() -> dict[str, str]:
    """PATH/PULUMI_HOME/PULUMI_BIN for the CLI that scripts/install-pulumi provides (built if needed)."""
    result = subprocess.run([str(REPO / "scripts" / "install-pulumi"), "--cli-only"],
                            capture_output=True, text=True, check=False, timeout=3000)
    assert result.returncode == 0, f"install-pulumi failed:\n{result.stderr[-3000:]}"
    env_file = result.stdout.strip().splitlines()[-1]
    exported = subprocess.run(
        ["bash", "-c", f". {env_file} && export PULUMI_BIN=$(command -v pulumi) && env -0"],
        capture_output=True, check=True).stdout.decode().split("\0")
    env = dict(item.split("=", 1) for item in exported if "=" in item)
    keys = ("PATH", "PULUMI_HOME", "PULUMI_SKIP_UPDATE_CHECK",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "PULUMI_BIN")
    return {key: env[key] for key in keys if key in env}


@contextmanager
def _cwd(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


class Project:
    """A copy of the project's Pulumi.yaml with one stack file, in a directory of its own.

    Tests never write the repository's stack files: `set_config` and the secrets' salt land here.
    """

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.state = directory / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        (directory / "Pulumi.yaml").write_text((REPO / "Pulumi.yaml").read_text())
        self.env = env | {"PULUMI_BACKEND_URL": f"file://{self.state}",
                          "PULUMI_CONFIG_PASSPHRASE": "kimipd-tests"}

    def write_stack(self, name: str, values: dict[str, Any]) -> None:
        config = {f"kimipd:{key}": value for key, value in values.items()}
        (self.directory / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))

    def _program(self) -> None:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        with _cwd(self.directory):
            runpy.run_path(str(REPO / "__main__.py"), run_name="__main__")

    def stack(self, name: str) -> auto.Stack:
        # The CLI scripts/install-pulumi provided, not whatever `pulumi` is on the caller's PATH.
        cli = auto.PulumiCommand(root=str(Path(self.env["PULUMI_BIN"]).parent.parent))
        options = auto.LocalWorkspaceOptions(work_dir=str(self.directory), env_vars=self.env,
                                             pulumi_command=cli)
        return auto.create_or_select_stack(stack_name=name, project_name="kimipd",
                                           program=self._program, opts=options)
