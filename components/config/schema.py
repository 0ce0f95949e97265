"""The sections of a stack file, one pydantic model each (ClusterConfig holds them all); the
router's and the door's are router_schema.py's."""

from __future__ import annotations

import ipaddress
import re
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field, field_validator

from .base import Model
from .grammars import (
    CAPABILITIES,
    ULIMIT_NAMES,
    absolute_path,
    checked_ipv4,
    did_you_mean,
    host_key_problem,
)


def node_resource_name(address: str) -> str:
    """A node's resources are named after it: node-A-B-C-D (ops names them the same way,
    through components/render/naming.py)."""
    return "node-" + address.replace(".", "-")


class NodeSpec(Model):
    """One GPU host, reached over SSH."""

    address: str
    ssh_user: str = "root"
    ssh_port: int = Field(default=22, ge=1, le=65535)
    gpus: int = Field(default=8, ge=0)
    # `ssh-ed25519 AAAA...`: pinned host key; unset means the key is not checked.
    host_key: str | None = None
    # true: the node is taken out of service (lost, in repair). Its groups leave every router
    # slot and are deleted; nothing on it is contacted; `scripts/kimipd up` drops its resources
    # from the state. Back to false, the next `up` prepares it from scratch (docs/healing.md).
    out: bool = False

    @field_validator("address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        return checked_ipv4(value, "the node's compute-network address, e.g. 174.1.60.1")

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
        return node_resource_name(self.address)


class ModelSpec(Model):
    # Inside the containers: mounted by container.volumes, or carried by the image (inImage).
    path: str
    served_model_name: str | None = None
    # true: the image itself carries model.path, so no volume has to mount it.
    in_image: bool = False

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        # SGLang reads a path that does not exist as a Hugging Face hub id and starts downloading.
        return absolute_path(value, "SGLang would take a relative path for a Hugging Face hub "
                              "id and try to download it", "/data/models/Kimi-K3")


class GroupSpec(Model):
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
    # How long the group may load (weights, warm-up) before a running group that does not serve
    # is hung, not loading: status and reconcile leave a loading group alone until then
    # (docs/healing.md). Unset: gates.timeoutSeconds, what its gate waits for the same load.
    load_bound_seconds: int | None = Field(default=None, ge=1)

    @property
    def rank0(self) -> str:
        return self.nodes[0]


class MooncakeMasterSpec(Model):
    node: str
    rpc_port: int = Field(default=50051, ge=1, le=65535)
    metrics_port: int = Field(default=9003, ge=1, le=65535)
    extra_args: list[str] = []
    # The cuda13 wheel's mooncake_master links libcuda. The NVIDIA runtime with
    # NVIDIA_VISIBLE_DEVICES=none mounts the driver libraries without giving it a GPU.
    # null: the image's default runtime (a CPU-only master, as in the sim).
    runtime: str | None = "nvidia"


class NodeFileSpec(Model):
    """A file every node needs, copied from the machine running Pulumi."""

    source: str
    destination: str
    sha256: str | None = None

    @field_validator("destination")
    @classmethod
    def _file_path(cls, value: str) -> str:
        example = "/tmp/patch_k3_sm120.py"
        absolute_path(value, "the file is copied to this path on every node", example)
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


class NetworkSpec(Model):
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


class VolumeSpec(Model):
    host_path: str
    container_path: str
    read_only: bool = True

    @field_validator("host_path")
    @classmethod
    def _host_absolute(cls, value: str) -> str:
        return absolute_path(value, "docker reads a name that is not a path as a named volume "
                              "(a new, empty one) and refuses other relative paths", "/data/models")

    @field_validator("container_path")
    @classmethod
    def _container_absolute(cls, value: str) -> str:
        absolute_path(value, "docker refuses a relative mount point", "/data/models")
        if PurePosixPath(value) == PurePosixPath("/"):
            raise ValueError(f"{value!r} would hide the image's whole file system (docker refuses "
                             "it); mount on a directory below /, e.g. /data/models")
        return value


class ContainerSpec(Model):
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
            absolute_path(device, "docker maps a device by its path on the node",
                           "/dev/infiniband")
        return value

    @field_validator("ulimits")
    @classmethod
    def _ulimit_names(cls, value: dict[str, int]) -> dict[str, int]:
        # docker refuses the container at create time, after every node has been prepared.
        for name in value:
            if name not in ULIMIT_NAMES:
                raise ValueError(f"{name!r} is not a ulimit name docker knows"
                                 f"{did_you_mean(name, ULIMIT_NAMES)}, so it refuses to create "
                                 f"the container: use one of {', '.join(ULIMIT_NAMES)}")
        return value

    @field_validator("capabilities")
    @classmethod
    def _capability_names(cls, value: list[str]) -> list[str]:
        for capability in value:
            name = capability.upper().removeprefix("CAP_")
            if name != "ALL" and name not in CAPABILITIES:
                raise ValueError(f"{capability!r} is not a Linux capability"
                                 f"{did_you_mean(name, CAPABILITIES)}; docker refuses the "
                                 "container: use a name from capabilities(7) without CAP_, "
                                 "e.g. IPC_LOCK")
        return value


class PreflightSpec(Model):
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
        return absolute_path(value, "preflight measures free space there on every node (a "
                              "relative path would be read from the SSH user's home)",
                              "/var/lib/docker")


class GatesSpec(Model):
    timeout_seconds: int = Field(default=1800, ge=1)
    # Each poll is one local HTTP GET and one `docker inspect` on the node, and a gate sits on
    # the critical path up to one interval late: poll often (docs/decisions.md).
    interval_seconds: float = Field(default=1.0, ge=0.1, le=60)


class SmokeTestSpec(Model):
    body: dict[str, Any] = {"text": "Hello", "sampling_params": {"max_new_tokens": 16}}
    timeout_seconds: int = Field(default=300, ge=1)


class ConnectionSpec(Model):
    # known_hosts file on the machine running Pulumi: pins every node's host key for both the
    # command provider and the docker provider's ssh. Unset: only nodes[].hostKey is checked.
    known_hosts_file: str | None = None
    # Extra `ssh` options for the docker provider (it runs the system ssh client), e.g.
    # ["-o", "IdentityFile=~/.ssh/kimipd"]: paths only, never a key.
    docker_ssh_opts: list[str] = []
    dial_error_limit: int = Field(default=10, ge=1)
    per_dial_timeout_seconds: int = Field(default=15, ge=1)


class VerificationSpec(Model):
    """`scripts/kimipd verify`: the runbook's requests (exact token counts) and, where measured
    on this cluster, the figures a regression falls short of. Not used by the deployment."""

    class Request(Model):
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


class MetricsSpec(Model):
    # SGLang's --enable-metrics on every group, and the stack output prometheusTargets (every
    # rank's /metrics and the Mooncake master's metrics port) for a Prometheus file_sd_configs.
    enabled: bool = False


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not an address or network; write one as 174.1.60.0/24, "
                         "10.0.0.7 or ::/0") from None
    return value


class FirewallSpec(Model):
    """Each node's nftables table, owned by the program (components/firewall.py).

    The cluster's members (every node) reach every port; from anywhere else only SSH, the
    router's port (from clientNetworks) and the metrics ports (from monitoringHosts) answer, so
    the ports SGLang, NCCL and Mooncake pick at run time are closed by source, not by a list."""

    enabled: bool = True
    # Who may reach router.port, the cluster's door. Default: anyone, as without a firewall.
    client_networks: list[str] = ["0.0.0.0/0", "::/0"]
    # Prometheus and the like: each rank's --port (/metrics; SGLang's admin routes there need
    # the key), the Mooncake master's metrics port and the rust router's metrics port.
    monitoring_hosts: list[str] = []
    # Treated as members, every port: the machine running Pulumi or a bastion whose tools
    # (kimipd status, logs) probe the nodes directly; they fall back to SSH without it.
    operator_hosts: list[str] = []
    # TCP ports anyone may reach on every node: the node's own services (node_exporter, ...),
    # which the table would otherwise refuse to non-members.
    open_ports: list[int] = []

    @field_validator("client_networks", "monitoring_hosts", "operator_hosts")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        return [_network(item) for item in value]

    @field_validator("open_ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        for port in value:
            if not 1 <= port <= 65535:
                raise ValueError(f"{port!r} is not a TCP port; write a number from 1 to 65535")
        return value
