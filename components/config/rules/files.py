"""Files and the model path: what the containers mount and the nodes receive."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


def _covers(mount_point: str, path: str) -> bool:
    mount_point, path = posixpath.normpath(mount_point), posixpath.normpath(path)
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def model_reachable(cfg: ClusterConfig) -> Iterable[str]:
    if cfg.model.in_image:
        return
    volumes = [volume.container_path for volume in cfg.container.volumes]
    if any(_covers(point, cfg.model.path) for point in volumes):
        return
    mounted = ", ".join(repr(point) for point in volumes) or "none"
    yield (f"model.path: {cfg.model.path!r} is not inside any volume mounted into the containers "
           f"(container.volumes[].containerPath: {mounted}), so the ranks would not find it and "
           "SGLang would take it for a Hugging Face hub id: mount the directory that holds it "
           "(container.volumes), or set model.inImage: true if the image carries it.")


def mount_points_distinct(cfg: ClusterConfig) -> Iterable[str]:
    # Every node file is mounted at its destination too (render.container_mounts).
    seen: dict[str, str] = {}
    for index, node_file in enumerate(cfg.node_files):
        point = posixpath.normpath(node_file.destination)
        seen.setdefault(point, f"nodeFiles[{index}].destination")
    for index, volume in enumerate(cfg.container.volumes):
        key = f"container.volumes[{index}].containerPath"
        point = posixpath.normpath(volume.container_path)
        if point in seen:
            yield (f"{key}: {volume.container_path!r} is already mounted by {seen[point]}; docker "
                   "refuses two mounts on one point (Duplicate mount point) when it creates the "
                   "containers: mount it elsewhere or remove one.")
        seen.setdefault(point, key)


def node_files_distinct(cfg: ClusterConfig) -> Iterable[str]:
    seen: set[str] = set()
    for index, node_file in enumerate(cfg.node_files):
        if node_file.destination in seen:
            yield (f"nodeFiles[{index}].destination: {node_file.destination!r} appears twice, so "
                   "one file would overwrite the other on every node: give each file its own "
                   "destination.")
        seen.add(node_file.destination)
