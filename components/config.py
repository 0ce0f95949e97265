"""The stack's configuration as one typed, validated model.

Stack YAML (`kimipd:*` keys) -> `ClusterConfig`. Everything below this module reads the model,
never `pulumi.Config`. Every rule of the runbook that can be checked before anything is touched
lives here, in validators whose messages name the key, the value, the reason and the fix.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from . import versions
from .cli_spec import CliTable, router_table, sglang_table

CONFIG_NAMESPACE = "kimipd"
# Keys read with `Config.get_secret`; they never enter the model (and so never enter a rendering).
SECRET_KEYS = frozenset({"sshPrivateKey"})

MIN_MOONCAKE_VERSION = versions.MOONCAKE_MIN
MOONCAKE_WHEEL_PREFIX = "mooncake_transfer_engine"


class ConfigError(ValueError):
    """A stack configuration that must not be deployed; the message says what to change."""


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
    )


class NodeSpec(_Model):
    """One GPU host, reached over SSH."""

    address: str
    ssh_user: str = "root"
    ssh_port: int = Field(default=22, ge=1, le=65535)
    gpus: int = Field(default=8, ge=0)
    # `ssh-ed25519 AAAA...`: pinned host key; unset means the key is not checked.
    host_key: str | None = None

    @field_validator("address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(
                f"address {value!r} is not an IPv4 address; write the node's compute-network "
                "address, e.g. 174.1.60.1"
            ) from None
        return value

    @property
    def resource_name(self) -> str:
        return "node-" + self.address.replace(".", "-")


class ModelSpec(_Model):
    path: str
    served_model_name: str | None = None


class GroupSpec(_Model):
    """One multi-node SGLang server: all ranks of a prefill or a decode group."""

    mode: Literal["prefill", "decode"]
    nodes: list[str] = Field(min_length=1)  # addresses, in rank order
    tp_size: int = Field(ge=1)
    ep_size: int = Field(default=1, ge=1)
    http_port: int = Field(default=30000, ge=1, le=65535)
    bootstrap_port: int = Field(default=8998, ge=1, le=65535)
    dist_init_port: int = Field(default=20000, ge=1, le=65535)
    transfer_backend: str = "mooncake"
    # Optional, as the old profiles carried DIST_INIT_ADDR; it must name the first node.
    dist_init_host: str | None = None
    extra_args: list[str] = []
    env: dict[str, str] = {}

    @property
    def rank0(self) -> str:
        return self.nodes[0]


class RouterSpec(_Model):
    node: str
    # `mini-lb`: SGLang's MiniLB (random choice, no state). `rust`: the sglang-router policy router.
    kind: Literal["mini-lb", "rust"] = "mini-lb"
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two"] = "random"
    host: str = "0.0.0.0"
    port: int = Field(default=31000, ge=1, le=65535)
    extra_args: list[str] = []


class MooncakeMasterSpec(_Model):
    node: str
    rpc_port: int = Field(default=50051, ge=1, le=65535)
    metrics_port: int = Field(default=9003, ge=1, le=65535)
    extra_args: list[str] = []
    # The cuda13 wheel's mooncake_master links libcuda. The NVIDIA runtime with
    # NVIDIA_VISIBLE_DEVICES=none mounts the driver libraries without giving it a GPU.
    # null: the image's default runtime (a CPU-only master, as in the sim).
    runtime: str | None = "nvidia"


class NodeFileSpec(_Model):
    """A file every node needs, copied from the machine running Pulumi."""

    source: str
    destination: str
    sha256: str | None = None

    @field_validator("destination")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"destination {value!r} must be an absolute path on the node")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError(f"sha256 {value!r} is not 64 lowercase hex digits")
        return value

    @property
    def file_name(self) -> str:
        return PurePosixPath(self.destination).name

    @property
    def is_wheel(self) -> bool:
        return self.file_name.endswith(".whl")

    @property
    def is_patch(self) -> bool:
        return self.file_name.endswith(".py")


class NetworkSpec(_Model):
    compute_interface: str = "bond1"
    management_interface: str = "bond0"
    rdma_devices: list[str] = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    # NCCL/GLOO default to the compute interface; set only to name another compute-side interface.
    nccl_socket_interface: str | None = None
    gloo_socket_interface: str | None = None
    # RoCE GID index for NCCL and Mooncake; unset leaves the libraries' defaults.
    ib_gid_index: int | None = None

    @property
    def nccl_interface(self) -> str:
        return self.nccl_socket_interface or self.compute_interface

    @property
    def gloo_interface(self) -> str:
        return self.gloo_socket_interface or self.compute_interface


class VolumeSpec(_Model):
    host_path: str
    container_path: str
    read_only: bool = True


class ContainerSpec(_Model):
    gpus: str | None = "all"
    devices: list[str] = ["/dev/infiniband"]
    shm_size_mb: int = Field(default=65536, ge=64)
    ulimits: dict[str, int] = {"memlock": -1, "stack": 67108864}
    capabilities: list[str] = ["IPC_LOCK"]
    privileged: bool = False
    # A lone restarted rank cannot rejoin its NCCL group, so docker must not restart one on its own.
    restart: Literal["no", "on-failure", "always", "unless-stopped"] = "no"
    volumes: list[VolumeSpec] = []
    env: dict[str, str] = {}


class PreflightSpec(_Model):
    enabled: bool = True
    check_gpus: bool = True
    max_gpu_memory_used_mib: int = Field(default=0, ge=0)
    check_rdma: bool = True
    check_nvidia_runtime: bool = True
    disk_path: str = "/var/lib/docker"
    min_free_disk_gb: int = Field(default=200, ge=0)
    # model.path's config.json on every rank's node, through the volume that mounts it; skipped
    # when no volume covers model.path (the image may carry the model).
    check_model: bool = True


class GatesSpec(_Model):
    timeout_seconds: int = Field(default=1800, ge=1)
    interval_seconds: int = Field(default=10, ge=1)


class SmokeTestSpec(_Model):
    body: dict[str, Any] = {"text": "Hello", "sampling_params": {"max_new_tokens": 16}}
    timeout_seconds: int = Field(default=300, ge=1)


class ConnectionSpec(_Model):
    # known_hosts file on the machine running Pulumi: pins every node's host key for both the
    # command provider and the docker provider's ssh. Unset: only nodes[].hostKey is checked.
    known_hosts_file: str | None = None
    # Extra `ssh` options for the docker provider (it runs the system ssh client), e.g.
    # ["-o", "IdentityFile=~/.ssh/kimipd"]: paths only, never a key.
    docker_ssh_opts: list[str] = []
    dial_error_limit: int = Field(default=10, ge=1)
    per_dial_timeout_seconds: int = Field(default=15, ge=1)


class ClusterConfig(_Model):
    image: str
    # The Mooncake version the image itself ships; only consulted when no Mooncake wheel is
    # among nodeFiles (then the image's own version is what runs).
    image_mooncake_version: str | None = None
    model: ModelSpec
    nodes: list[NodeSpec] = Field(min_length=1)
    mooncake_master: MooncakeMasterSpec
    groups: dict[str, GroupSpec] = Field(min_length=1)
    router: RouterSpec
    node_files: list[NodeFileSpec] = []
    network: NetworkSpec = NetworkSpec()
    container: ContainerSpec = ContainerSpec()
    preflight: PreflightSpec = PreflightSpec()
    gates: GatesSpec = GatesSpec()
    smoke_test: SmokeTestSpec = SmokeTestSpec()
    connection: ConnectionSpec = ConnectionSpec()
    # false: keep node preparation (files, image, preflight), remove every container.
    serving: bool = True
    # Bumping it replaces every container, in dependency order (the runbook's `restart`).
    restart_generation: int = Field(default=0, ge=0)

    @field_validator("image_mooncake_version", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # Pulumi.yaml's default is "" (its schema has no null).
        return value or None

    # -- derived views (no component re-derives these) ------------------------------------

    def node(self, address: str) -> NodeSpec:
        return next(node for node in self.nodes if node.address == address)

    def groups_in_mode(self, mode: str) -> dict[str, GroupSpec]:
        return {name: group for name, group in self.groups.items() if group.mode == mode}

    def roles_of(self, address: str) -> list[str]:
        roles = []
        if self.mooncake_master.node == address:
            roles.append("mooncake-master")
        for name, group in self.groups.items():
            if address in group.nodes:
                roles.append(f"{name}-r{group.nodes.index(address)}")
        if self.router.node == address:
            roles.append("router")
        return roles

    def ports_on(self, address: str) -> dict[int, str]:
        """Every port this node's containers bind (host networking), in order -> the key that
        sets it. Every rank binds --port (ranks >= 1 SGLang's dummy health server), prefill
        rank 0 the bootstrap port, rank 0 of a multi-node group dist-init..+7."""
        ports: dict[int, str] = {}
        master = self.mooncake_master
        if master.node == address:
            ports[master.rpc_port] = "mooncakeMaster.rpcPort"
            ports[master.metrics_port] = "mooncakeMaster.metricsPort"
        for name, group in self.groups.items():
            if address not in group.nodes:
                continue
            ports[group.http_port] = f"groups.{name}.httpPort"
            if address == group.rank0 and group.mode == "prefill":
                ports[group.bootstrap_port] = f"groups.{name}.bootstrapPort"
            if address == group.rank0 and len(group.nodes) > 1:
                for offset in range(8):
                    suffix = f"+{offset}" if offset else ""
                    ports[group.dist_init_port + offset] = f"groups.{name}.distInitPort{suffix}"
        if self.router.node == address:
            ports[self.router.port] = "router.port"
        return dict(sorted(ports.items()))

    # -- the runbook's hard rules and the cross-field checks --------------------------------

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        problems = [
            *_unknown_nodes(self),
            *_duplicate_nodes(self),
            *_group_shape(self),
            *_groups_share_no_node_per_mode(self),
            *_both_modes_present(self),
            *_no_expandable_segments(self),
            *_compute_network_only(self),
            *_no_nixl(self),
            *_extra_args_parse(self),
            *_mooncake_new_enough(self),
            *_router_policy(self),
            *_ports_do_not_collide(self),
            *_node_files_distinct(self),
        ]
        if problems:
            raise ValueError("\n".join(problems))
        return self


def _unknown_nodes(cfg: ClusterConfig) -> Iterable[str]:
    known = {node.address for node in cfg.nodes}
    fix = "add it to `nodes` or use one of " + ", ".join(sorted(known))
    for name, group in cfg.groups.items():
        for rank, address in enumerate(group.nodes):
            if address not in known:
                yield f"groups.{name}.nodes[{rank}]: {address!r} is not a declared node; {fix}."
    for key, address in (("mooncakeMaster.node", cfg.mooncake_master.node),
                         ("router.node", cfg.router.node)):
        if address not in known:
            yield f"{key}: {address!r} is not a declared node; {fix}."


def _duplicate_nodes(cfg: ClusterConfig) -> Iterable[str]:
    seen: set[str] = set()
    for index, node in enumerate(cfg.nodes):
        if node.address in seen:
            yield (f"nodes[{index}].address: {node.address!r} is declared twice; "
                   "keep one entry per host.")
        seen.add(node.address)


def _group_shape(cfg: ClusterConfig) -> Iterable[str]:
    for name, group in cfg.groups.items():
        key = f"groups.{name}"
        seen: set[str] = set()
        for rank, address in enumerate(group.nodes):
            if address in seen:
                first = group.nodes.index(address)
                yield (f"{key}.nodes[{rank}]: {address!r} already holds rank {first}; one rank "
                       "per node, each node once.")
            seen.add(address)
        if group.dist_init_host is not None and group.dist_init_host != group.rank0:
            yield (f"{key}.distInitHost: {group.dist_init_host!r} is not the group's first node "
                   f"{group.rank0!r}; rank 0 runs on the first node of `nodes` and every rank "
                   "dials it: reorder `nodes` or remove distInitHost.")
        if seen <= _addresses(cfg):
            gpus = sum(cfg.node(address).gpus for address in group.nodes)
            if group.tp_size != gpus:
                yield (f"{key}.tpSize: {group.tp_size} does not span the group's GPUs "
                       f"({len(group.nodes)} nodes, {gpus} GPUs); SGLang shards one server "
                       f"over every GPU of its nodes: set tpSize to {gpus} or change the nodes.")
        if group.ep_size > group.tp_size:
            yield (f"{key}.epSize: {group.ep_size} exceeds tpSize {group.tp_size}; experts are "
                   f"sharded over the tensor-parallel ranks: set epSize <= {group.tp_size}.")


def _addresses(cfg: ClusterConfig) -> set[str]:
    return {node.address for node in cfg.nodes}


def _groups_share_no_node_per_mode(cfg: ClusterConfig) -> Iterable[str]:
    for mode in ("prefill", "decode"):
        owner: dict[str, str] = {}
        for name, group in cfg.groups_in_mode(mode).items():
            for address in group.nodes:
                if address in owner:
                    yield (f"groups.{name}.nodes: {address!r} is already in {mode} group "
                           f"{owner[address]!r}; a node's GPUs serve one {mode} group.")
                owner.setdefault(address, name)


def _both_modes_present(cfg: ClusterConfig) -> Iterable[str]:
    for mode in ("prefill", "decode"):
        if not cfg.groups_in_mode(mode):
            yield (f"groups: no group has mode {mode!r}; PD disaggregation needs at least one "
                   "prefill and one decode group.")


def _all_env(cfg: ClusterConfig) -> Iterable[tuple[str, Mapping[str, str]]]:
    yield "container.env", cfg.container.env
    for name, group in cfg.groups.items():
        yield f"groups.{name}.env", group.env


_EXPANDABLE = re.compile(r"expandable_segments\s*:\s*true", re.IGNORECASE)


# PyTorch >= 2.9 reads PYTORCH_ALLOC_CONF too (the new name of PYTORCH_CUDA_ALLOC_CONF).
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _no_expandable_segments(cfg: ClusterConfig) -> Iterable[str]:
    for key, env in _all_env(cfg):
        for variable in ALLOCATOR_VARIABLES:
            value = env.get(variable, "")
            if _EXPANDABLE.search(value):
                yield (f"{key}.{variable}: {value!r} makes Mooncake RDMA registration fail (Bad "
                       "address; Mooncake #2511/#351: the server looks healthy and fails on the "
                       "first KV transfer); remove expandable_segments:True.")


def _compute_network_only(cfg: ClusterConfig) -> Iterable[str]:
    net = cfg.network
    management = net.management_interface
    reason = (f"NCCL/GLOO traffic must use the compute network ({net.compute_interface}), "
              f"never the management network {management}")
    for key, value in (("network.ncclSocketInterface", net.nccl_interface),
                       ("network.glooSocketInterface", net.gloo_interface),
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


def _no_nixl(cfg: ClusterConfig) -> Iterable[str]:
    for name, group in cfg.groups.items():
        if group.transfer_backend.lower() == "nixl":
            yield (f"groups.{name}.transferBackend: 'nixl' fails on this hardware (single VRAM "
                   "transfers above ~20 MB end in NIXL_ERR_REMOTE_DISCONNECT and SGLang sends a "
                   "request's whole KV at once); use 'mooncake'.")
        elif group.transfer_backend != "mooncake":
            yield (f"groups.{name}.transferBackend: {group.transfer_backend!r} is not supported "
                   "by this program; use 'mooncake'.")


# Flags the program renders from the model. Given again in extraArgs, argparse keeps the last
# occurrence, so the cluster would run something other than what config, preview and the stack
# outputs say. dest -> the key that sets it ({group} is the group's key prefix).
MANAGED_SGLANG_FLAGS = {
    "model_path": "model.path",
    "served_model_name": "model.servedModelName",
    "disaggregation_mode": "{group}.mode",
    "disaggregation_transfer_backend": "{group}.transferBackend",
    "disaggregation_bootstrap_port": "{group}.bootstrapPort",
    "disaggregation_ib_device": "network.rdmaDevices",
    "tp_size": "{group}.tpSize",
    "ep_size": "{group}.epSize",
    "nnodes": "{group}.nodes",
    "node_rank": "{group}.nodes (rank order)",
    "dist_init_addr": "{group}.distInitPort (the host is the group's first node)",
    "host": "nothing: every rank binds 0.0.0.0 so decode reaches prefill's bootstrap server",
    "port": "{group}.httpPort",
}
MANAGED_ROUTER_FLAGS = {
    "pd_disaggregation": "nothing: the router always runs in PD mode",
    "mini_lb": "router.kind",
    "policy": "router.policy",
    "prefill": "groups (every prefill group is passed with its bootstrap port)",
    "decode": "groups (every decode group is passed)",
    "host": "router.host",
    "port": "router.port",
}


def _extra_args_problems(key: str, args: list[str], table: CliTable,
                         managed: Mapping[str, str]) -> Iterable[str]:
    complaint = table.check(args)
    if complaint is not None:
        yield (f"{key}: {args!r} is refused by {table.label}'s own parser ({complaint}); fix "
               f"the flag or its value (the launch would exit with status 2 on the node).")
    for occurrence in table.occurrences(args):
        setter = managed.get(occurrence.option.dest)
        if setter is not None:
            canonical = occurrence.option.options[0]
            yield (f"{key}[{occurrence.index}]: {occurrence.written!r} sets {canonical}, which "
                   f"the program renders itself (the last occurrence wins, so the cluster would "
                   f"run something other than config, preview and outputs say); remove it and "
                   f"set {setter}.")


def _extra_args_parse(cfg: ClusterConfig) -> Iterable[str]:
    for name, group in cfg.groups.items():
        managed = {dest: setter.format(group=f"groups.{name}")
                   for dest, setter in MANAGED_SGLANG_FLAGS.items()}
        yield from _extra_args_problems(f"groups.{name}.extraArgs", group.extra_args,
                                        sglang_table(), managed)
    yield from _extra_args_problems("router.extraArgs", cfg.router.extra_args, router_table(),
                                    MANAGED_ROUTER_FLAGS)


_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")


def parse_mooncake_version(version: str) -> tuple[int, int, int, int]:
    """`0.3.12.post1` -> (0, 3, 12, 1); a release without `.postN` sorts before its posts."""
    match = _VERSION.match(version)
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


def _mooncake_new_enough(cfg: ClusterConfig) -> Iterable[str]:
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
            yield (f"nodeFiles[{index}].destination: {error}; name the wheel as pip built it "
                   f"(e.g. mooncake_transfer_engine_cuda13-{MIN_MOONCAKE_VERSION}-cp312-...whl).")
            continue
        if too_old:
            yield (f"nodeFiles[{index}].destination: {node_file.file_name!r} is Mooncake "
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


def _router_policy(cfg: ClusterConfig) -> Iterable[str]:
    if cfg.router.kind == "mini-lb" and cfg.router.policy != "random":
        yield (f"router.policy: {cfg.router.policy!r} is ignored by MiniLB, which always picks at "
               "random; set router.kind to 'rust' or remove router.policy.")


def _ports_do_not_collide(cfg: ClusterConfig) -> Iterable[str]:
    """Every listening port a process binds, per node. Every rank binds --port (rank 0 the API,
    ranks >= 1 SGLang's dummy health server); rank 0 also binds dist-init+1..+7."""
    bound: dict[tuple[str, int], str] = {}
    problems = []

    def bind(address: str, port: int, owner: str) -> None:
        if (address, port) in bound and bound[(address, port)] != owner:
            problems.append(f"{owner}: port {port} on {address} is already used by "
                            f"{bound[(address, port)]}; choose another port.")
        bound.setdefault((address, port), owner)

    master = cfg.mooncake_master
    bind(master.node, master.rpc_port, "mooncakeMaster.rpcPort")
    bind(master.node, master.metrics_port, "mooncakeMaster.metricsPort")
    for name, group in cfg.groups.items():
        for address in group.nodes:
            bind(address, group.http_port, f"groups.{name}.httpPort")
        if group.mode == "prefill":
            bind(group.rank0, group.bootstrap_port, f"groups.{name}.bootstrapPort")
        if len(group.nodes) > 1:
            for offset in range(8):
                bind(group.rank0, group.dist_init_port + offset, f"groups.{name}.distInitPort")
    bind(cfg.router.node, cfg.router.port, "router.port")
    return problems


def _node_files_distinct(cfg: ClusterConfig) -> Iterable[str]:
    seen: set[str] = set()
    for index, node_file in enumerate(cfg.node_files):
        if node_file.destination in seen:
            yield (f"nodeFiles[{index}].destination: {node_file.destination!r} appears twice; "
                   "each destination once.")
        seen.add(node_file.destination)


# -- warnings: deployable, but probably not what the operator meant ---------------------------

FLASH_KDA_WHEEL_PREFIX = "flash_kda"
# SGLang uses flash_kda only when a linear-attention backend flag selects it (default: triton).
FLASH_KDA_FLAGS = ("linear_attn_backend", "linear_attn_prefill_backend",
                   "linear_attn_decode_backend")


def flag_values(args: list[str], dest: str) -> list[str]:
    """Every value ARGS gives the SGLang option with this dest (`--flag v` and `--flag=v`)."""
    values = []
    for occurrence in sglang_table().occurrences(args):
        if occurrence.option.dest != dest:
            continue
        if "=" in occurrence.written:
            values.append(occurrence.written.split("=", 1)[1])
        elif occurrence.index + 1 < len(args):
            values.append(args[occurrence.index + 1])
    return values


def config_warnings(cfg: ClusterConfig) -> list[str]:
    """What `pulumi preview` should say before it deploys this stack."""
    warnings = []
    shipped = [(i, f) for i, f in enumerate(cfg.node_files)
               if f.is_wheel and f.file_name.startswith(FLASH_KDA_WHEEL_PREFIX)]
    selecting = [name for name, group in cfg.groups.items()
                 if any("flashkda" in flag_values(group.extra_args, dest)
                        for dest in FLASH_KDA_FLAGS)]
    for index, node_file in shipped:
        if not selecting:
            warnings.append(
                f"nodeFiles[{index}]: {node_file.file_name!r} is installed in every container, "
                "but no group selects it, so SGLang runs its default linear-attention backend "
                "(triton); to use it add `--linear-attn-prefill-backend flashkda` (or "
                "`--linear-attn-backend flashkda`) to groups.<name>.extraArgs, or remove the "
                "wheel from nodeFiles.")
    return warnings


# -- loading ---------------------------------------------------------------------------------


def _location(loc: tuple[Any, ...]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def load_cluster_config(raw: Mapping[str, Any]) -> ClusterConfig:
    """Validate the `kimipd:*` config values (namespace stripped); raise ConfigError on any problem."""
    try:
        return ClusterConfig.model_validate(dict(raw))
    except ValidationError as error:
        lines = []
        for item in error.errors():
            key = _location(item["loc"])
            if item["type"] == "extra_forbidden":
                lines.append(f"{key}: unknown key (value {item['input']!r}); check its spelling "
                             "against the keys documented in Pulumi.yaml.")
            elif item["type"] == "value_error":
                for line in str(item["ctx"]["error"]).splitlines():
                    lines.append(f"{key}: {line}" if key else line)
            elif item["type"] == "missing":
                lines.append(f"{key}: required key is missing; set it in the stack file.")
            else:
                lines.append(f"{key}: {item['input']!r}: {item['msg']}.")
        raise ConfigError("invalid kimipd stack configuration:\n  " + "\n  ".join(lines)) from None


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `kimipd:*` values of a `Pulumi.<stack>.yaml` file (see stack_file_values)."""
    return stack_file_values(yaml.safe_load(path.read_text()))


def stack_file_values(stack_yaml: Mapping[str, Any]) -> dict[str, Any]:
    """The `kimipd:*` values of a parsed `Pulumi.<stack>.yaml`, namespace stripped, secrets left out."""
    prefix = CONFIG_NAMESPACE + ":"
    values = {}
    for key, value in (stack_yaml.get("config") or {}).items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if name not in SECRET_KEYS:
            values[name] = value
    return values
