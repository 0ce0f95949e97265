"""The node files (wheels, patches): how launch.sh installs them, and the prepared image that holds
them once per node."""

from __future__ import annotations

import hashlib
import json

from .. import versions
from ..config import MOONCAKE_WHEEL_PREFIX, ClusterConfig
from .layout import LAUNCH_SCRIPT, NODE_ASSET_DIR, PREPARE_IMAGE_SCRIPT, shell


def node_file_install_args(cfg: ClusterConfig, *, mooncake_only: bool = False) -> list[str]:
    """launch.sh's options: the node files' wheels (the Mooncake one in place of the image's),
    the patches, and the Mooncake release Python must then import."""
    args = []
    for node_file in cfg.node_files:
        if node_file.is_wheel and node_file.file_name.startswith(MOONCAKE_WHEEL_PREFIX):
            args += ["--mooncake-wheel", node_file.destination]
        elif node_file.is_wheel and not mooncake_only:
            args += ["--wheel", node_file.destination]
    for node_file in cfg.node_files:
        if node_file.is_patch and not mooncake_only:
            args += ["--patch", node_file.destination]
    args += ["--require-mooncake", versions.MOONCAKE_MIN]
    if cfg.router.kind == "rust" and not mooncake_only:
        # Proven while the prepared image is built, before any container changes.
        args += ["--require-module", "smg.launch_router",
                 f"router.kind rust runs (smg {versions.SMG}): add smg's wheel to nodeFiles "
                 "(pip download smg==" + versions.SMG + " --no-deps; docs/router.md)"]
    return args


def launch_wrapper(cfg: ClusterConfig, *, mooncake_only: bool = False) -> list[str]:
    """assets/launch.sh in front of every server (it execs it, and resolves the master's binary).

    installNodeFiles `image`: the node's prepared image already holds the wheels and patches,
    proven when it was built, so launch.sh only execs. `container-start`: launch.sh installs
    them in every container as it starts. mooncake_only (the master): just the Mooncake wheel; a
    failed patch must not take the metadata service down with it.
    """
    if cfg.install_node_files == "image":
        return ["bash", LAUNCH_SCRIPT, "--"]
    return ["bash", LAUNCH_SCRIPT, *node_file_install_args(cfg, mooncake_only=mooncake_only), "--"]


PREPARED_IMAGE_REPOSITORY = "kimipd/prepared"


# The scripts that shape the prepared image: the build itself and what it copies in
# (assets/prepare-image.sh). A change to any other node script (the router's, the door's) must not
# re-tag every node's image, which would replace every rank.
IMAGE_SCRIPTS = ("prepare-image.sh", "launch.sh", "mooncake-check.py")


def prepared_image_tag(cfg: ClusterConfig, base_image_id: str, file_digests: dict[str, str],
                       scripts: dict[str, str]) -> str:
    """A tag that names every input of the prepared image: a changed wheel, patch, image script
    (IMAGE_SCRIPTS) or base image is a new tag (so a new build and new containers); the same
    inputs reuse the image."""
    inputs = {
        "base": base_image_id,
        "install": node_file_install_args(cfg),
        "files": {f.destination: file_digests[f.destination] for f in cfg.node_files},
        "scripts": {name: hashlib.sha256(text.encode()).hexdigest()
                    for name, text in sorted(scripts.items()) if name in IMAGE_SCRIPTS},
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{PREPARED_IMAGE_REPOSITORY}:{digest[:20]}"


def prepare_image_command(cfg: ClusterConfig, address: str, base_image_id: str, tag: str,
                          stack: str, file_digests: dict[str, str]) -> str:
    """assets/prepare-image.sh on the node: build (or reuse) its prepared image from exactly the
    files whose digests the stack knows (it checks each one it builds from)."""
    argv = ["bash", PREPARE_IMAGE_SCRIPT, "--node", address, "--base", base_image_id,
            "--tag", tag, "--stack", stack]
    for node_file in cfg.node_files:
        argv += ["--sha256", node_file.destination, file_digests[node_file.destination]]
    return shell([*argv, "--", *node_file_install_args(cfg)])


def prepared_image_id(stdout: str) -> str:
    """The image id prepare-image.sh prints last."""
    lines = stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("sha256:"):
        raise ValueError(f"prepare-image.sh printed no image id: {stdout[-500:]!r}")
    return lines[-1]


def prepare_dirs_command(cfg: ClusterConfig) -> str:
    dirs = sorted({NODE_ASSET_DIR}
                  | {f.destination.rsplit("/", 1)[0] or "/" for f in cfg.node_files})
    return shell(["mkdir", "-p", *dirs])
