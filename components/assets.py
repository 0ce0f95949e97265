"""The files every node needs: the program's scripts and the operator's wheels and patches."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pulumi
import pulumi_command as command

from .config import ClusterConfig, ConfigError, NodeFileSpec
from .render import NODE_ASSET_DIR, NODE_SCRIPTS, prepare_dirs_command

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_node_file_sources(node_files: list[NodeFileSpec], base_dir: Path) -> dict[str, str]:
    """Check every source on the machine running Pulumi; return destination -> sha256.

    Runs before any resource is registered, so a missing or corrupt wheel touches nothing.
    """
    problems, digests = [], {}
    for index, node_file in enumerate(node_files):
        source = base_dir / Path(node_file.source).expanduser()
        key = f"nodeFiles[{index}].source"
        if not source.is_file():
            problems.append(f"{key}: {node_file.source!r} does not exist on this machine; copy "
                            "the file here or fix the path.")
            continue
        digest = sha256_of(source)
        if node_file.sha256 is not None and digest != node_file.sha256:
            problems.append(f"{key}: {node_file.source!r} has sha256 {digest}, but "
                            f"nodeFiles[{index}].sha256 expects {node_file.sha256!r}; the file "
                            "changed or is the wrong build: fetch the right one or update sha256.")
        digests[node_file.destination] = digest
    if problems:
        raise ConfigError("invalid kimipd node files:\n  " + "\n  ".join(problems))
    return digests


class NodeAssets(pulumi.ComponentResource):
    """The program's scripts under /opt/kimipd and the node files, copied onto one node.

    CopyToRemote re-copies a file only when its content (or destination) changes.
    """

    def __init__(self, cfg: ClusterConfig, node_name: str,
                 connection: command.remote.ConnectionArgsDict,
                 wait_for: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kimipd:assets:NodeAssets", f"{node_name}-assets", None, opts)
        # Children do not inherit a component's depends_on, so the first write waits explicitly.
        directories = command.remote.Command(
            f"{node_name}-dirs",
            connection=connection,
            create=prepare_dirs_command(cfg),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(wait_for)),
        )
        after_dirs = pulumi.ResourceOptions(parent=self, depends_on=[directories])
        copies = [
            command.remote.CopyToRemote(
                f"{node_name}-script-{script.removesuffix('.sh')}",
                connection=connection,
                source=pulumi.FileAsset(str(ASSETS_DIR / script)),
                remote_path=f"{NODE_ASSET_DIR}/{script}",
                opts=after_dirs,
            )
            for script in NODE_SCRIPTS
        ]
        copies += [
            command.remote.CopyToRemote(
                f"{node_name}-file-{Path(node_file.destination).name}",
                connection=connection,
                source=pulumi.FileAsset(str(Path(node_file.source).expanduser())),
                remote_path=node_file.destination,
                opts=after_dirs,
            )
            for node_file in cfg.node_files
        ]
        self.copies = copies
        self.register_outputs({})
