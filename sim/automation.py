"""The real Pulumi engine, driven through the Automation API on a file backend (demo and tests).

`Project` runs the program inline (the SDK's in-process language server runs `__main__.py`) on a
copy of Pulumi.yaml with a stack file of its own, so no `pulumi-language-python` binary is needed;
`repo_stack` is the repository's own stack as the CLI sees it (scripts/setup-stack-sim).
"""

from __future__ import annotations

import json
import os
import runpy
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto

REPO = Path(__file__).resolve().parent.parent


def sourced_env(shell: str) -> dict[str, str]:
    """The environment after running SHELL (e.g. sourcing an env file) in bash."""
    exported = subprocess.run(["bash", "-c", f"{shell} && env -0"], capture_output=True,
                              check=True).stdout.decode().split("\0")
    return dict(item.split("=", 1) for item in exported if "=" in item)


def sim_exports() -> dict[str, str]:
    """The KIMIPD_SIM_* values `sim/sim env` prints (key, known_hosts, image, ssh config)."""
    exported = sourced_env(f'eval "$({REPO / "sim" / "sim"} env)"')
    return {key: value for key, value in exported.items() if key.startswith("KIMIPD_SIM_")}


ENGINE_PARALLEL = "32"


def engine_env() -> dict[str, str]:
    """PATH/PULUMI_HOME/PULUMI_BIN for the CLI that scripts/install-pulumi installed.

    scripts/test installs the toolchain before pytest starts and exports KIMIPD_PULUMI_ENV (the
    env file install-pulumi writes); the tests only look it up. Outside scripts/test (the demo),
    install-pulumi runs here: a cached CLI answers in seconds.
    """
    env_file = os.environ.get("KIMIPD_PULUMI_ENV")
    if not env_file:
        result = subprocess.run([str(REPO / "scripts" / "install-pulumi"), "--cli-only"],
                                capture_output=True, text=True, check=False, timeout=3000)
        assert result.returncode == 0, f"install-pulumi failed:\n{result.stderr[-3000:]}"
        env_file = result.stdout.strip().splitlines()[-1]
    env = sourced_env(f". {env_file} && export PULUMI_BIN=$(command -v pulumi)")
    keys = ("PATH", "PULUMI_HOME", "PULUMI_SKIP_UPDATE_CHECK",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "PULUMI_BIN")
    # The CLI's default --parallel is 4 x cores (8 here); gates, drains and admissions hold a
    # slot while they wait, so the tests' ups run wider (docs/decisions.md).
    return {key: env[key] for key in keys if key in env} | {"PULUMI_PARALLEL": ENGINE_PARALLEL}


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
        """Set the stack's `kimipd:*` values; an existing file keeps its secrets and salt."""
        path = self.directory / f"Pulumi.{name}.yaml"
        document = yaml.safe_load(path.read_text()) if path.exists() else {"config": {}}
        secrets = {k: v for k, v in document["config"].items() if isinstance(v, dict) and "secure" in v}
        document["config"] = {f"kimipd:{key}": value for key, value in values.items()} | secrets
        path.write_text(yaml.safe_dump(document))

    def update_stack(self, name: str, changes: dict[str, Any]) -> None:
        """Change `kimipd:*` keys in place, keeping what `set_config` wrote (secrets, salt)."""
        path = self.directory / f"Pulumi.{name}.yaml"
        document = yaml.safe_load(path.read_text())
        for key, value in changes.items():
            document["config"][f"kimipd:{key}"] = value
        path.write_text(yaml.safe_dump(document))

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


class ObservabilityProject:
    """The observability project (observability/Pulumi.yaml) in a directory of its own, on the
    backend of a serving Project, so its StackReference reads that project's stacks
    (organization/kimipd/STACK). The program runs inline, like Project's."""

    NAMESPACE = "kimipd-observability"

    def __init__(self, directory: Path, serving: Project) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "Pulumi.yaml").write_text((REPO / "observability" / "Pulumi.yaml").read_text())
        self.env = serving.env

    def write_stack(self, name: str, values: dict[str, Any]) -> None:
        """Set the stack's `kimipd-observability:*` values; secrets and salt are kept."""
        path = self.directory / f"Pulumi.{name}.yaml"
        document = yaml.safe_load(path.read_text()) if path.exists() else {"config": {}}
        secrets = {k: v for k, v in document["config"].items() if isinstance(v, dict) and "secure" in v}
        document["config"] = {f"{self.NAMESPACE}:{key}": value for key, value in values.items()} | secrets
        path.write_text(yaml.safe_dump(document))

    def _program(self) -> None:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        with _cwd(self.directory):
            runpy.run_path(str(REPO / "observability" / "__main__.py"), run_name="__main__")

    def stack(self, name: str) -> auto.Stack:
        cli = auto.PulumiCommand(root=str(Path(self.env["PULUMI_BIN"]).parent.parent))
        options = auto.LocalWorkspaceOptions(work_dir=str(self.directory), env_vars=self.env,
                                             pulumi_command=cli)
        return auto.create_or_select_stack(stack_name=name, project_name="kimipd-observability",
                                           program=self._program, opts=options)


def sim_stack_env(state: Path | None = None) -> dict[str, str]:
    """Runs scripts/setup-stack-sim, the documented set-up of stack `sim` for the CLI in the
    repository root, and returns the environment its exports give: the CLI on PATH, PULUMI_HOME,
    the sim's backend and passphrase, and PULUMI_BIN. STATE: the backend's directory (default the
    documented one, $KIMIPD_CACHE/state, ~/.cache/kimipd/state by default)."""
    env = dict(os.environ) | ({"KIMIPD_SIM_STATE": str(state)} if state else {})
    exports = subprocess.run([str(REPO / "scripts" / "setup-stack-sim")], stdout=subprocess.PIPE,
                             text=True, env=env, check=True, timeout=3000).stdout
    exported = sourced_env(f"eval {shlex.quote(exports)} && export PULUMI_BIN=$(command -v pulumi)")
    keys = ("PATH", "PULUMI_HOME", "PULUMI_SKIP_UPDATE_CHECK",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "PULUMI_BIN", "PULUMI_BACKEND_URL",
            "PULUMI_CONFIG_PASSPHRASE")
    return {key: exported[key] for key in keys if key in exported}


def language_host_missing(env: dict[str, str]) -> Path | None:
    """The file the CLI needs to run `__main__.py` itself (beside the CLI), or None."""
    bin_dir = Path(env["PULUMI_BIN"]).parent
    for name in ("pulumi-language-python", "pulumi-language-python-exec"):
        if not (bin_dir / name).exists():
            return bin_dir / name
    return None


def _repo_program() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    with _cwd(REPO):
        runpy.run_path(str(REPO / "__main__.py"), run_name="__main__")


def repo_stack(env: dict[str, str], name: str = "sim") -> auto.Stack:
    """Stack NAME of the repository itself: its Pulumi.yaml and Pulumi.NAME.yaml, the backend in
    ENV (sim_stack_env), as the CLI in the repository root sees it. The program runs through the
    language host beside the CLI, as `pulumi up` runs it; where that host is missing (a CLI built
    from Go modules), inline in this process, with the same stack file and state."""
    cli = auto.PulumiCommand(root=str(Path(env["PULUMI_BIN"]).parent.parent))
    options = auto.LocalWorkspaceOptions(work_dir=str(REPO), env_vars=env, pulumi_command=cli)
    if language_host_missing(env) is None:
        return auto.select_stack(stack_name=name, work_dir=str(REPO), opts=options)
    return auto.select_stack(stack_name=name, project_name="kimipd", program=_repo_program,
                             opts=options)


# The resource plugins the program needs, at the versions of the pinned Python SDKs.
REQUIRED_PLUGINS = frozenset({("command", "1.2.1"), ("docker", "5.2.0")})


def installed_plugins(env: dict[str, str]) -> set[tuple[str, str]]:
    """(name, version) of the resource plugins the engine can load without downloading."""
    result = subprocess.run([env["PULUMI_BIN"], "plugin", "ls", "--json"], capture_output=True,
                            text=True, env={**os.environ, **env}, check=True)
    return {(p["name"], p["version"]) for p in json.loads(result.stdout or "[]")
            if p.get("kind") == "resource"}
