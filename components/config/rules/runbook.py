"""The runbook's hard rules: what broke the real cluster, refused before anything is touched.

No expandable_segments, Mooncake >= 0.3.12.post1, NCCL/GLOO on the compute network, no NIXL on this
hardware, and no restart of a lone rank by docker. (P before D is the graph's own order.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


from ... import versions

MIN_MOONCAKE_VERSION = versions.MOONCAKE_MIN
MOONCAKE_WHEEL_PREFIX = "mooncake_transfer_engine"


def restart_only_by_the_program(cfg: ClusterConfig) -> Iterable[str]:
    multi_node = [name for name, group in cfg.groups.items() if len(group.nodes) > 1]
    if cfg.container.restart != "no" and multi_node:
        yield (f"container.restart: {cfg.container.restart!r} lets docker restart a rank of a "
               f"multi-node group ({', '.join(multi_node)}) on its own, and a lone restarted rank "
               "cannot rejoin its NCCL group (docs/decisions.md): set it to 'no'; a dead group "
               "comes back with `pulumi refresh` then `pulumi up`.")


def _all_env(cfg: ClusterConfig) -> Iterable[tuple[str, Mapping[str, str]]]:
    yield "container.env", cfg.container.env
    for name, group in cfg.groups.items():
        yield f"groups.{name}.env", group.env


_EXPANDABLE = re.compile(r"expandable_segments\s*:\s*true", re.IGNORECASE)


# PyTorch >= 2.9 reads PYTORCH_ALLOC_CONF too (the new name of PYTORCH_CUDA_ALLOC_CONF).
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def no_expandable_segments(cfg: ClusterConfig) -> Iterable[str]:
    for key, env in _all_env(cfg):
        for variable in ALLOCATOR_VARIABLES:
            value = env.get(variable, "")
            if _EXPANDABLE.search(value):
                yield (f"{key}.{variable}: {value!r} makes Mooncake RDMA registration fail (Bad "
                       "address; Mooncake #2511/#351: the server looks healthy and fails on the "
                       "first KV transfer); remove expandable_segments:True.")


def compute_network_only(cfg: ClusterConfig) -> Iterable[str]:
    net = cfg.network
    management = net.management_interface
    reason = ("NCCL/GLOO traffic must use the compute network, never the management network "
              f"{management}")
    # Only the keys the stack sets: NCCL/GLOO's defaults follow computeInterface.
    for key, value in (("network.ncclSocketInterface", net.nccl_socket_interface),
                       ("network.glooSocketInterface", net.gloo_socket_interface),
                       ("network.computeInterface", net.compute_interface)):
        if value == management:
            yield (f"{key}: {value!r} is the management interface; {reason}: set it to the "
                   "compute interface.")
    for key, env in _all_env(cfg):
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            value = env.get(var)
            if value is None:
                continue
            if value.startswith("^"):
                yield (f"{key}.{var}: {value!r} is an exclusion list, which lets NCCL/GLOO pick "
                       f"any other interface, {management} included; {reason}: remove it (the "
                       "program sets it from network.computeInterface).")
            elif management in value.lstrip("=").split(","):
                yield (f"{key}.{var}: {value!r} names the management interface; {reason}: "
                       "remove it (the program sets it from network.computeInterface).")


def no_nixl(cfg: ClusterConfig) -> Iterable[str]:
    for name, group in cfg.groups.items():
        if group.transfer_backend.lower() == "nixl":
            yield (f"groups.{name}.transferBackend: {group.transfer_backend!r} (NIXL) fails on "
                   "this hardware (single VRAM transfers above ~20 MB end in "
                   "NIXL_ERR_REMOTE_DISCONNECT and SGLang sends a request's whole KV at once); "
                   "use 'mooncake'.")
        elif group.transfer_backend != "mooncake":
            yield (f"groups.{name}.transferBackend: {group.transfer_backend!r} is not supported "
                   "by this program; use 'mooncake'.")


MOONCAKE_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")


def parse_mooncake_version(version: str) -> tuple[int, int, int, int]:
    """`0.3.12.post1` -> (0, 3, 12, 1); a release without `.postN` sorts before its posts."""
    match = MOONCAKE_VERSION.match(version)
    if not match:
        raise ValueError(f"unrecognised Mooncake version {version!r}")
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch), int(post) if post is not None else -1


def wheel_version(file_name: str) -> str:
    """The version field of a wheel file name (PEP 427: name-version-...-tags.whl)."""
    parts = file_name.removesuffix(".whl").split("-")
    if len(parts) < 5:
        raise ValueError(f"{file_name!r} is not a wheel file name (name-version-py-abi-platform)")
    return parts[1]


def mooncake_new_enough(cfg: ClusterConfig) -> Iterable[str]:
    minimum = parse_mooncake_version(MIN_MOONCAKE_VERSION)
    reason = (f"Mooncake >= {MIN_MOONCAKE_VERSION} is required (dmabuf registration fix, "
              "Mooncake #2035)")
    wheels = [(i, f) for i, f in enumerate(cfg.node_files)
              if f.is_wheel and f.file_name.startswith(MOONCAKE_WHEEL_PREFIX)]
    if len(wheels) > 1:
        listed = ", ".join(f"nodeFiles[{i}] {f.file_name!r}" for i, f in wheels)
        yield (f"nodeFiles: {len(wheels)} Mooncake wheels ({listed}); they install the same "
               "`mooncake` package over each other, so which one runs is unknown: keep one.")
    for index, node_file in wheels:
        try:
            version = wheel_version(node_file.file_name)
            too_old = parse_mooncake_version(version) < minimum
        except ValueError as error:
            yield (f"nodeFiles[{index}].destination: {node_file.destination!r} does not say which "
                   f"Mooncake it is ({error}), and {reason}: name the wheel as pip built it "
                   f"(e.g. mooncake_transfer_engine_cuda13-{MIN_MOONCAKE_VERSION}-cp312-...whl).")
            continue
        if too_old:
            yield (f"nodeFiles[{index}].destination: {node_file.destination!r} is Mooncake "
                   f"{version}; {reason}: ship the {MIN_MOONCAKE_VERSION} wheel or newer.")
    if not wheels:
        image_version = cfg.image_mooncake_version
        if image_version is None:
            yield (f"nodeFiles: no {MOONCAKE_WHEEL_PREFIX}*.whl, so the image's own Mooncake "
                   f"runs; {reason}: add the wheel to nodeFiles, or declare "
                   "imageMooncakeVersion if the image already ships a fixed one.")
        elif parse_mooncake_version(image_version) < minimum:
            yield (f"imageMooncakeVersion: {image_version!r} is too old; {reason}: add the "
                   f"{MIN_MOONCAKE_VERSION} wheel to nodeFiles.")
