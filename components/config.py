"""The stack's configuration as one typed, validated model.

Stack YAML (`kimipd:*` keys) -> `ClusterConfig`. Everything below this module reads the model,
never `pulumi.Config`. Every rule of the runbook that can be checked before anything is touched
lives here, in validators whose messages name the key, the value, the reason and the fix.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import json
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

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


# -- value grammars: what docker, ssh and the kernel accept, checked before anything runs --------

# Public host key types an sshd offers (what ssh-keyscan and known_hosts carry).
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                  "ecdsa-sha2-nistp521", "ssh-rsa", "sk-ssh-ed25519@openssh.com",
                  "sk-ecdsa-sha2-nistp256@openssh.com")
_FINGERPRINT = re.compile(r"(?:SHA256|MD5):\S+|(?:[0-9a-fA-F]{2}:){15}[0-9a-fA-F]{2}")


def host_key_problem(value: str) -> str | None:
    """Why VALUE is not `TYPE BASE64` of a public host key, or None."""
    fields = value.split()
    if _FINGERPRINT.fullmatch(value.strip()):
        return "is a fingerprint, not a key (ssh shows fingerprints, but pins the key itself)"
    if len(fields) == 3 and fields[1] in HOST_KEY_TYPES:
        return (f"starts with the host name {fields[0]!r} (a known_hosts line); hostKey is the "
                "key alone")
    if len(fields) != 2 or fields[0] not in HOST_KEY_TYPES:
        return f"is not `TYPE BASE64` with TYPE one of {', '.join(HOST_KEY_TYPES)}"
    try:
        blob = base64.b64decode(fields[1], validate=True)
    except (binascii.Error, ValueError):
        return "has a key part that is not base64"
    length = int.from_bytes(blob[:4], "big")
    if blob[4:4 + length] != fields[0].encode():
        return f"has a key part that is not a {fields[0]} key (copied from another line?)"
    return None


# docker's reference grammar (distribution/reference): [HOST[:PORT]/]PATH[:TAG][@DIGEST].
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:(?P<domain>{_DOMAIN})/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?",
    re.ASCII)


def image_reference_problem(value: str) -> str | None:
    """Why docker would refuse VALUE as an image reference, or None."""
    if not value.strip():
        return "is empty"
    if value != value.strip() or any(c.isspace() for c in value):
        return "contains whitespace"
    if value.endswith(":") or ":@" in value:
        return "has an empty tag"
    if value.endswith("@"):
        return "has an empty digest"
    match = IMAGE_REFERENCE.fullmatch(value)
    if match is None:
        if value.lower() != value and IMAGE_REFERENCE.fullmatch(value.lower()):
            return "has upper-case letters in its repository name (docker wants lower case)"
        return "does not follow docker's reference grammar"
    domain = match.group("domain")
    # docker reads a first component as a registry only if it has a `.` or `:` or is localhost.
    if domain is not None and not ("." in domain or ":" in domain or domain == "localhost") \
            and domain.lower() != domain:
        return "has upper-case letters in its repository name (docker wants lower case)"
    if len(match.group("name")) > 255:
        return "has a name longer than 255 characters"
    return None


# docker's `--ulimit` names (docker/go-units ulimit.go).
ULIMIT_NAMES = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile",
                "nproc", "rss", "rtprio", "rttime", "sigpending", "stack")
# Linux capabilities (linux/capability.h); docker takes them with or without CAP_, or ALL.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE")


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the one choice WORD is probably a misspelling of, else ``."""
    folded = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=0.6)
    # An abbreviation (`dest`) is far from its word by edit distance, but only one word starts so.
    close = close or [f for f in folded if f.startswith(word.lower())][:2]
    return f" (did you mean {folded[close[0]]!r}?)" if len(close) == 1 else ""


def _absolute_path(value: str, what: str, example: str) -> str:
    """VALUE unchanged if it is an absolute path; else a ValueError naming WHAT it is for."""
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path; {what}: write the full path, "
                         f"e.g. {example}")
    return value


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
                f"{value!r} is not an IPv4 address; write the node's compute-network "
                "address, e.g. 174.1.60.1"
            ) from None
        return value

    @field_validator("host_key")
    @classmethod
    def _public_key(cls, value: str | None) -> str | None:
        # Caught here, a wrong pin fails at preview; at `up` it fails every SSH dial of the node
        # after other nodes' preparation has started.
        if value is not None:
            problem = host_key_problem(value)
            if problem is not None:
                raise ValueError(f"{value!r} {problem}; paste the node's public host key as "
                                 "`TYPE BASE64` (the last two fields of `ssh-keyscan -t ed25519 "
                                 "ADDRESS`, once its fingerprint matches the node's own)")
        return value

    @property
    def resource_name(self) -> str:
        return "node-" + self.address.replace(".", "-")


class ModelSpec(_Model):
    # Inside the containers: mounted by container.volumes, or carried by the image (inImage).
    path: str
    served_model_name: str | None = None
    # true: the image itself carries model.path, so no volume has to mount it.
    in_image: bool = False

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        # SGLang reads a path that does not exist as a Hugging Face hub id and starts downloading.
        return _absolute_path(value, "SGLang would take a relative path for a Hugging Face hub "
                              "id and try to download it", "/data/models/Kimi-K3")


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
    # Bumping it replaces this group's containers only (and what follows them: the router when
    # it must, the smoke test); every other group keeps its containers.
    restart_generation: int = Field(default=0, ge=0)

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
    def _file_path(cls, value: str) -> str:
        example = "/tmp/patch_k3_sm120.py"
        _absolute_path(value, "the file is copied to this path on every node", example)
        if value.rsplit("/", 1)[1] in ("", ".", ".."):
            # The copy and the container's mount both need the file's own path.
            raise ValueError(f"{value!r} names a directory, not a file; the file is copied and "
                             f"mounted at exactly this path: add the file name, e.g. {example}")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError(f"{value!r} is not 64 lowercase hex digits; write what `sha256sum "
                             "SOURCE` prints (lower case), or remove sha256")
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

    @field_validator("rdma_devices")
    @classmethod
    def _devices_named(cls, value: list[str]) -> list[str]:
        # The list becomes --disaggregation-ib-device and NCCL_IB_HCA (comma-joined) and what
        # preflight checks; empty, SGLang and NCCL pick adapters themselves, unchecked.
        fix = "list the compute network's RDMA devices, e.g. [mlx5_0, mlx5_1, mlx5_2, mlx5_3]"
        if not value:
            raise ValueError("[] names no RDMA device, so Mooncake and NCCL pick adapters "
                             f"themselves and preflight checks none; {fix}")
        for device in value:
            if not device.strip() or "," in device or any(c.isspace() for c in device):
                raise ValueError(f"{value!r}: {device!r} is not one device name (the list is "
                                 f"joined with commas for SGLang and NCCL); {fix}")
        return value

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

    @field_validator("host_path")
    @classmethod
    def _host_absolute(cls, value: str) -> str:
        return _absolute_path(value, "docker reads a name that is not a path as a named volume "
                              "(a new, empty one) and refuses other relative paths", "/data/models")

    @field_validator("container_path")
    @classmethod
    def _container_absolute(cls, value: str) -> str:
        _absolute_path(value, "docker refuses a relative mount point", "/data/models")
        if PurePosixPath(value) == PurePosixPath("/"):
            raise ValueError(f"{value!r} would hide the image's whole file system (docker refuses "
                             "it); mount on a directory below /, e.g. /data/models")
        return value


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

    @field_validator("devices")
    @classmethod
    def _device_paths(cls, value: list[str]) -> list[str]:
        for device in value:
            _absolute_path(device, "docker maps a device by its path on the node",
                           "/dev/infiniband")
        return value

    @field_validator("ulimits")
    @classmethod
    def _ulimit_names(cls, value: dict[str, int]) -> dict[str, int]:
        # docker refuses the container at create time, after every node has been prepared.
        for name in value:
            if name not in ULIMIT_NAMES:
                raise ValueError(f"{name!r} is not a ulimit name docker knows"
                                 f"{_did_you_mean(name, ULIMIT_NAMES)}, so it refuses to create "
                                 f"the container: use one of {', '.join(ULIMIT_NAMES)}")
        return value

    @field_validator("capabilities")
    @classmethod
    def _capability_names(cls, value: list[str]) -> list[str]:
        for capability in value:
            name = capability.upper().removeprefix("CAP_")
            if name != "ALL" and name not in CAPABILITIES:
                raise ValueError(f"{capability!r} is not a Linux capability"
                                 f"{_did_you_mean(name, CAPABILITIES)}; docker refuses the "
                                 "container: use a name from capabilities(7) without CAP_, "
                                 "e.g. IPC_LOCK")
        return value


class PreflightSpec(_Model):
    enabled: bool = True
    check_gpus: bool = True
    max_gpu_memory_used_mib: int = Field(default=0, ge=0)
    check_rdma: bool = True
    check_nvidia_runtime: bool = True
    disk_path: str = "/var/lib/docker"
    min_free_disk_gb: int = Field(default=200, ge=0)
    # model.path's config.json on every rank's node, through the volume that mounts it; skipped
    # when no volume covers model.path (model.inImage: the image carries the model).
    check_model: bool = True

    @field_validator("disk_path")
    @classmethod
    def _disk_absolute(cls, value: str) -> str:
        return _absolute_path(value, "preflight measures free space there on every node (a "
                              "relative path would be read from the SSH user's home)",
                              "/var/lib/docker")


class GatesSpec(_Model):
    timeout_seconds: int = Field(default=1800, ge=1)
    # Each poll is one local HTTP GET and one `docker inspect` on the node, and a gate sits on
    # the critical path up to one interval late: poll often (docs/decisions.md).
    interval_seconds: float = Field(default=1.0, ge=0.1, le=60)


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


class VerificationSpec(_Model):
    """`scripts/kimipd verify`: the runbook's requests (exact token counts) and, where measured
    on this cluster, the figures a regression falls short of. Not used by the deployment."""

    class Request(_Model):
        name: str
        input_tokens: int = Field(ge=1)
        output_tokens: int = Field(ge=1)
        # The alias generator would spell it maxE2ESeconds.
        max_e2e_seconds: float | None = Field(default=None, gt=0, alias="maxE2eSeconds")
        # input tokens / time to first token
        min_prefill_tokens_per_second: float | None = Field(default=None, gt=0)
        # (output tokens - 1) / (end-to-end - time to first token)
        min_decode_tokens_per_second: float | None = Field(default=None, gt=0)

    # The runbook's step-6 shapes (warmup, medium, long input), without thresholds.
    baseline: list[Request] = [
        Request(name="warmup", input_tokens=6, output_tokens=16),
        Request(name="medium", input_tokens=1680, output_tokens=512),
        Request(name="long", input_tokens=5280, output_tokens=256),
    ]
    # How far a measurement may fall short of a threshold before it counts as a regression.
    tolerance: float = Field(default=0.1, ge=0, lt=1)


class MetricsSpec(_Model):
    # SGLang's --enable-metrics on every group, and the stack output prometheusTargets (every
    # rank's /metrics and the Mooncake master's metrics port) for a Prometheus file_sd_configs.
    enabled: bool = False


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
    verification: VerificationSpec = VerificationSpec()
    metrics: MetricsSpec = MetricsSpec()
    # false: keep node preparation (files, image, preflight), remove every container.
    serving: bool = True
    # Bumping it replaces every container, in dependency order (the runbook's `restart`).
    restart_generation: int = Field(default=0, ge=0)
    # When decode may start. sequential (runbook rule 2 as run): once every prefill group is
    # healthy. overlapped: once each prefill rank 0's KV bootstrap server answers (SGLang 0.5.19
    # starts it before the model loads, and decode's start never dials prefill), so the two
    # loads overlap. Either way the router waits for every group's health gate.
    start_order: Literal["sequential", "overlapped"] = "sequential"
    # Where the node files' wheels and patches are installed. image: once per node during
    # preparation, into a prepared image every container runs (a failed install or patch, or an
    # old Mooncake, stops preparation before any container changes; containers start in
    # seconds). container-start: by launch.sh in every container as it starts (the runbook's way).
    install_node_files: Literal["image", "container-start"] = "image"

    @field_validator("image_mooncake_version", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # Pulumi.yaml's default is "" (its schema has no null).
        return value or None

    @field_validator("image_mooncake_version")
    @classmethod
    def _version_form(cls, value: str | None) -> str | None:
        if value is not None and not _VERSION.match(value):
            raise ValueError(f"{value!r} is not a Mooncake version (X.Y.Z or X.Y.Z.postN), so it "
                             "cannot be compared with the minimum: write it as `pip show "
                             "mooncake-transfer-engine` prints it, e.g. 0.3.12.post1, or leave it "
                             "empty")
        return value

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        # Caught here rather than by `docker pull` on every node once their preparation started.
        problem = image_reference_problem(value)
        if problem is not None:
            raise ValueError(f"{value!r} {problem}, so docker cannot pull it; write "
                             "[REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST] in lower case, "
                             "e.g. lmsysorg/sglang:kimi-k3")
        return value

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

    def port_bindings(self) -> Iterator[PortBinding]:
        """Every port a container binds (host networking: the node's own). Every rank binds
        --port (ranks >= 1 SGLang's dummy health server), prefill rank 0 the bootstrap port,
        rank 0 of a multi-node group dist-init..+7."""
        master = self.mooncake_master
        yield PortBinding(master.node, master.rpc_port, "mooncakeMaster.rpcPort")
        yield PortBinding(master.node, master.metrics_port, "mooncakeMaster.metricsPort")
        for name, group in self.groups.items():
            for address in group.nodes:
                yield PortBinding(address, group.http_port, f"groups.{name}.httpPort", name)
            if group.mode == "prefill":
                yield PortBinding(group.rank0, group.bootstrap_port,
                                  f"groups.{name}.bootstrapPort", name)
            if len(group.nodes) > 1:
                for offset in range(8):
                    yield PortBinding(group.rank0, group.dist_init_port + offset,
                                      f"groups.{name}.distInitPort", name, offset)
        yield PortBinding(self.router.node, self.router.port, "router.port")

    def ports_on(self, address: str) -> dict[int, str]:
        """Every port this node's containers bind, in order -> the key that sets it."""
        return dict(sorted((binding.port, binding.key + (f"+{binding.offset}" if binding.offset
                                                          else ""))
                           for binding in self.port_bindings() if binding.node == address))

    # -- the runbook's hard rules and the cross-field checks --------------------------------

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        problems = [
            *_unknown_nodes(self),
            *_duplicate_nodes(self),
            *_group_names(self),
            *_group_shape(self),
            *_groups_share_no_node_per_mode(self),
            *_gpus_per_node(self),
            *_both_modes_present(self),
            *_model_reachable(self),
            *_mount_points_distinct(self),
            *_restart_only_by_the_program(self),
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
        # A duplicate or undeclared node is refused above; its GPUs would only mislead here.
        tp_spans = True
        if seen <= _addresses(cfg) and len(seen) == len(group.nodes):
            gpus = sum(cfg.node(address).gpus for address in group.nodes)
            tp_spans = group.tp_size == gpus
            if not tp_spans:
                yield (f"{key}.tpSize: {group.tp_size} does not span the group's GPUs "
                       f"({len(group.nodes)} nodes, {gpus} GPUs); SGLang shards one server "
                       f"over every GPU of its nodes: set tpSize to {gpus} or change the nodes.")
        # While tpSize itself is refused, its fix decides what epSize must fit: no verdict yet.
        if tp_spans and group.ep_size > group.tp_size:
            yield (f"{key}.epSize: {group.ep_size} exceeds tpSize {group.tp_size}; experts are "
                   f"sharded over the tensor-parallel ranks: set epSize <= {group.tp_size}.")
        elif tp_spans and group.tp_size % group.ep_size:
            divisors = [n for n in range(1, group.tp_size + 1) if group.tp_size % n == 0]
            yield (f"{key}.epSize: {group.ep_size} does not divide tpSize {group.tp_size}; "
                   "SGLang splits the tensor-parallel ranks into epSize expert groups of equal "
                   "size (0.5.19 stops loading with 'tp_size must be divisible by ep_size'): "
                   f"set epSize to a divisor of {group.tp_size} "
                   f"({', '.join(map(str, divisors))}).")
        last = group.dist_init_port + 7
        if len(group.nodes) > 1 and last > 65535:
            yield (f"{key}.distInitPort: {group.dist_init_port} leaves no room for the 7 ports "
                   f"rank 0 binds after it (up to {last}, past 65535): set it to "
                   f"{65535 - 7} or lower.")


def _addresses(cfg: ClusterConfig) -> set[str]:
    return {node.address for node in cfg.nodes}


def _groups_share_no_node_per_mode(cfg: ClusterConfig) -> Iterable[str]:
    for mode in ("prefill", "decode"):
        owner: dict[str, str] = {}
        for name, group in cfg.groups_in_mode(mode).items():
            for rank, address in enumerate(group.nodes):
                if address in owner and owner[address] != name:
                    yield (f"groups.{name}.nodes[{rank}]: {address!r} is already in {mode} group "
                           f"{owner[address]!r}; a node's GPUs serve one {mode} group: use "
                           "another node.")
                owner.setdefault(address, name)


def _both_modes_present(cfg: ClusterConfig) -> Iterable[str]:
    written = ", ".join(f"{name}: {group.mode}" for name, group in cfg.groups.items())
    for mode in ("prefill", "decode"):
        if not cfg.groups_in_mode(mode):
            yield (f"groups: no group has mode {mode!r} ({written}); PD disaggregation needs at "
                   f"least one prefill and one decode group: add a group with `mode: {mode}`.")


# What docker takes after a container name's first character; each rank's is kimipd-GROUP-rRANK.
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9_.-]+")


def _group_names(cfg: ClusterConfig) -> Iterable[str]:
    for name in cfg.groups:
        if not _CONTAINER_NAME.fullmatch(name):
            tidy = re.sub(r"[^a-zA-Z0-9_.-]+", "-", name).strip("-_.") or "prefill"
            yield (f"groups: {name!r} cannot be part of a container name (kimipd-{name}-r0): "
                   "docker takes letters, digits, `_`, `.` and `-` only: rename the group, e.g. "
                   f"{tidy!r}.")


def _gpus_per_node(cfg: ClusterConfig) -> Iterable[str]:
    """Each rank claims tpSize / len(nodes) GPUs of its node, starting at GPU 0 (every container
    sees all of the node's GPUs); together the ranks on a node must fit in its `gpus`."""
    known = _addresses(cfg)
    claims: dict[str, list[tuple[str, str, int, int]]] = {}  # address -> (group, mode, rank, gpus)
    for name, group in cfg.groups.items():
        nodes = group.nodes
        # Duplicate or undeclared nodes, or a tpSize that does not span the nodes: refused above.
        if len(set(nodes)) != len(nodes) or not set(nodes) <= known:
            continue
        if group.tp_size != sum(cfg.node(address).gpus for address in nodes):
            continue
        if group.tp_size % len(nodes):
            yield (f"groups.{name}.tpSize: {group.tp_size} is not a multiple of the group's "
                   f"{len(nodes)} nodes; SGLang gives every rank tpSize / nodes GPUs, so the "
                   "nodes' GPU counts must be equal: give the group nodes with the same number of "
                   "GPUs.")
            continue
        for rank, address in enumerate(nodes):
            claims.setdefault(address, []).append(
                (name, group.mode, rank, group.tp_size // len(nodes)))
    for index, node in enumerate(cfg.nodes):
        on_node = claims.get(node.address, [])
        modes = [mode for _, mode, _, _ in on_node]
        total = sum(gpus for _, _, _, gpus in on_node)
        # Two groups of one mode on a node are refused by _groups_share_no_node_per_mode.
        if total <= node.gpus or len(modes) != len(set(modes)):
            continue
        name, _, rank, gpus = on_node[-1]
        key = f"groups.{name}.nodes[{rank}]"
        if len(on_node) == 1:
            yield (f"{key}: {node.address!r} has {node.gpus} GPUs (nodes[{index}].gpus), but "
                   f"{name} rank {rank} would use {gpus} (tpSize {cfg.groups[name].tp_size} / "
                   f"{len(cfg.groups[name].nodes)} nodes; SGLang gives every rank the same "
                   "share): give the group nodes with the same number of GPUs.")
            continue
        listed = ", ".join(f"{group} rank {r}: {n}" for group, _, r, n in on_node)
        yield (f"{key}: {node.address!r} already runs "
               f"{', '.join(f'{g} rank {r}' for g, _, r, _ in on_node[:-1])}; its ranks would "
               f"claim {total} GPUs ({listed}) of its {node.gpus} (nodes[{index}].gpus), and "
               "every container sees all of the node's GPUs from GPU 0, so the groups would load "
               "onto the same GPUs: give each group nodes of its own.")


def _covers(mount_point: str, path: str) -> bool:
    mount_point, path = posixpath.normpath(mount_point), posixpath.normpath(path)
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _model_reachable(cfg: ClusterConfig) -> Iterable[str]:
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


def _mount_points_distinct(cfg: ClusterConfig) -> Iterable[str]:
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


def _restart_only_by_the_program(cfg: ClusterConfig) -> Iterable[str]:
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


def _no_nixl(cfg: ClusterConfig) -> Iterable[str]:
    for name, group in cfg.groups.items():
        if group.transfer_backend.lower() == "nixl":
            yield (f"groups.{name}.transferBackend: {group.transfer_backend!r} (NIXL) fails on "
                   "this hardware (single VRAM transfers above ~20 MB end in "
                   "NIXL_ERR_REMOTE_DISCONNECT and SGLang sends a request's whole KV at once); "
                   "use 'mooncake'.")
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
    "enable_metrics": "metrics.enabled (it also lists the targets in prometheusTargets)",
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


def _router_policy(cfg: ClusterConfig) -> Iterable[str]:
    if cfg.router.kind == "mini-lb" and cfg.router.policy != "random":
        yield (f"router.policy: {cfg.router.policy!r} is ignored by MiniLB, which always picks at "
               "random; set router.kind to 'rust' or remove router.policy.")


@dataclass(frozen=True)
class PortBinding:
    node: str
    port: int
    key: str  # the stack key that sets it
    group: str | None = None
    offset: int = 0  # dist-init: the key holds port - offset


def _ports_do_not_collide(cfg: ClusterConfig) -> Iterable[str]:
    """One port, one process, per node."""
    bound: dict[tuple[str, int], PortBinding] = {}
    reported: set[tuple[str, str]] = set()
    problems = []
    fix = ("every container uses the node's own network (host networking), so one port, one "
           "process: choose another port.")
    for binding in cfg.port_bindings():
        other = bound.setdefault((binding.node, binding.port), binding)
        if other.key == binding.key or (binding.key, other.key) in reported:
            continue
        # Two groups' ranks on one node are refused as such (_gpus_per_node,
        # _groups_share_no_node_per_mode): the fix is another node, not another port.
        if binding.group is not None and other.group is not None and binding.group != other.group:
            continue
        reported.add((binding.key, other.key))
        used = f"is already used by {other.key}; {fix}"
        if binding.offset:
            written = binding.port - binding.offset
            problems.append(f"{binding.key}: {written} makes rank 0 bind {written}-{written + 7} "
                            f"on {binding.node}, and {binding.port} {used}")
        else:
            problems.append(f"{binding.key}: {binding.port} on {binding.node} {used}")
    return problems


def _node_files_distinct(cfg: ClusterConfig) -> Iterable[str]:
    seen: set[str] = set()
    for index, node_file in enumerate(cfg.node_files):
        if node_file.destination in seen:
            yield (f"nodeFiles[{index}].destination: {node_file.destination!r} appears twice, so "
                   "one file would overwrite the other on every node: give each file its own "
                   "destination.")
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
    # pydantic locates a bad mapping key as (..., KEY, "[key]"): name the mapping holding it.
    if len(loc) >= 2 and loc[-1] == "[key]":
        loc = loc[:-2]
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def shown_value(value: Any) -> str:
    """VALUE as the stack file wrote it (the repr of what YAML read); never a private key."""
    text = repr(value)
    if "PRIVATE KEY" in text:
        return "<a private key, not shown>"
    return text if len(text) <= 200 else text[:200] + "..."


def _step(annotation: Any, part: Any) -> Any:
    """The type one location part further into ANNOTATION (a model, list, dict or optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    origin = get_origin(annotation)
    if origin is list and isinstance(part, int):
        return args[0]
    if origin is dict and isinstance(part, str):
        return args[1]
    if origin in (Union, UnionType) and len(args) == 1:
        return _step(args[0], part)
    return None


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose value sits at LOC (ClusterConfig at ()), if it is one."""
    annotation: Any = ClusterConfig
    for part in loc:
        annotation = _step(annotation, part)
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        annotation = args[0]
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


def _field_at(loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model holding the key at LOC and that key's field, as far as they can be found."""
    owner = _model_at(loc[:-1])
    if owner is None or not loc:
        return owner, None
    field = next((f for name, f in owner.model_fields.items() if loc[-1] in (name, f.alias)), None)
    return owner, field


def _keys_of(model: type[BaseModel] | None) -> str:
    """` (its keys: a, b)` for a model, else nothing."""
    if model is None:
        return ""
    return f" (its keys: {', '.join(f.alias or n for n, f in model.model_fields.items())})"


def _example(loc: tuple[Any, ...], field: FieldInfo | None) -> str:
    default = getattr(field, "default", None)
    if default is None or default is PydanticUndefined or isinstance(default, BaseModel):
        return ""
    return f", e.g. {loc[-1]}: {json.dumps(default)}"


# YAML 1.1 (PyYAML, and Pulumi's stack files) reads these unquoted words as booleans.
_YAML_BOOLEAN = "YAML reads an unquoted yes/no/on/off/true/false as a boolean"


def _type_problem(key: str, item: Mapping[str, Any]) -> str:
    """One pydantic error as KEY: VALUE-AS-WRITTEN, why, and the fix."""
    kind, value, ctx = item["type"], item.get("input"), item.get("ctx") or {}
    loc = tuple(item["loc"])
    shown = shown_value(value)
    model, field = _field_at(loc) if loc else (None, None)
    if kind == "extra_forbidden":
        keys = [f.alias or n for n, f in model.model_fields.items()] if model is not None else []
        where = _location(loc[:-1]) or "the stack"
        suggestion = _did_you_mean(str(loc[-1]), keys)
        listed = f" ({where}'s keys: {', '.join(keys)})" if keys else ""
        return (f"{key}: unknown key (value {shown}), so the program would never read it"
                f"{suggestion}: rename or remove it{listed}.")
    if kind == "missing":
        keys = _keys_of(_model_at(loc))
        return f"{key}: required key is missing; set it in the stack file{keys}."
    if kind in ("int_type", "int_parsing", "int_from_float", "int_parsing_size"):
        return (f"{key}: {shown} is not a whole number; write a plain integer, without quotes, "
                f"units or decimals{_example(loc, field)}.")
    if kind in ("float_type", "float_parsing"):
        return f"{key}: {shown} is not a number; write a plain number without quotes, e.g. 0.5."
    if kind in ("bool_type", "bool_parsing"):
        return f"{key}: {shown} is not true or false; write true or false, without quotes."
    if kind == "string_type":
        if isinstance(value, bool):
            return (f"{key}: {shown} is a boolean, not a string ({_YAML_BOOLEAN}): put the word "
                    "in quotes, e.g. \"no\".")
        if isinstance(value, (int, float)):
            return f"{key}: {shown} is a number, not a string: put it in quotes, \"{value}\"."
        return f"{key}: {shown} is not a string; write a single (quoted) string."
    if kind == "list_type":
        example = f"[{value}]" if isinstance(value, (str, int, float)) else "[a, b]"
        return (f"{key}: {shown} is not a list; write a YAML list, e.g. {example} (one item is "
                "still a list).")
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return (f"{key}: {shown} is not a mapping; write `key: value` lines under it"
                f"{_keys_of(_model_at(loc))}.")
    if kind in ("literal_error", "enum"):
        hint = f" ({_YAML_BOOLEAN})" if isinstance(value, bool) else ""
        quoted = " in quotes" if isinstance(value, bool) else ""
        return (f"{key}: {shown} is not one of {ctx.get('expected')}{hint}; write one of "
                f"them{quoted}.")
    bounds = {"greater_than_equal": ("ge", "is below the minimum {}", "set it to {} or more"),
              "greater_than": ("gt", "is not above {}", "set it above {}"),
              "less_than_equal": ("le", "is above the maximum {}", "set it to {} or less"),
              "less_than": ("lt", "is not below {}", "set it below {}")}
    if kind in bounds:
        name, why, fix = bounds[kind]
        return f"{key}: {shown} {why.format(ctx.get(name))}; {fix.format(ctx.get(name))}."
    if kind == "too_short":
        return (f"{key}: {shown} has {ctx.get('actual_length')} item(s), and at least "
                f"{ctx.get('min_length')} is needed; add one.")
    if kind == "too_long":
        return (f"{key}: {shown} has {ctx.get('actual_length')} items, at most "
                f"{ctx.get('max_length')} are allowed; remove some.")
    return (f"{key}: {shown} is refused ({item['msg']}); write the type Pulumi.yaml documents "
            f"for {key}.")


def load_cluster_config(raw: Mapping[str, Any]) -> ClusterConfig:
    """Validate the `kimipd:*` config values (namespace stripped); raise ConfigError on any problem."""
    try:
        return ClusterConfig.model_validate(dict(raw))
    except ValidationError as error:
        lines = []
        for item in error.errors():
            key = _location(item["loc"])
            if item["type"] == "value_error":
                for line in str(item["ctx"]["error"]).splitlines():
                    lines.append(f"{key}: {line}" if key else line)
            else:
                lines.append(_type_problem(key, item))
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
