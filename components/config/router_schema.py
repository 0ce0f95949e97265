"""The router's section of a stack file: the router itself, and the door (HAProxy in front of
two router slots) with its TLS and, on two nodes, its virtual IP."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .base import Model
from .grammars import checked_image_reference, checked_ipv4

RouterPolicy = Literal["random", "round_robin", "cache_aware", "power_of_two"]

SLOT_NAMES = ("a", "b")
RouterKind = Literal["mini-lb", "rust"]
# The runbook's router, when a stack does not say (ops reads the same default: ops/stack.py).
DEFAULT_ROUTER_KIND: RouterKind = "mini-lb"


class RouterSlotSpec(Model):
    """One of the two routers behind the door: its own port and its own metrics port."""

    port: int = Field(ge=1, le=65535)
    # rust only: the slot's Prometheus metrics (smg_*).
    metrics_port: int = Field(ge=1, le=65535)
    # rust only: what the door checks, beside the router in its process (router-launch.py):
    # 200 while it holds a healthy prefill and decode of one contract. Unset: port + 100.
    pair_check_port: int | None = Field(default=None, ge=1, le=65535)

    @property
    def check_port(self) -> int:
        return self.pair_check_port if self.pair_check_port is not None else self.port + 100


# A client's name, as the door's log, its map of keys and a metric label take it.
CLIENT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# The name the door gives routerApiKey: the program's own commands (smoke test, status, verify).
PROGRAM_CLIENT = "kimipd"


class DoorTlsSpec(Model):
    """HTTPS at the door. The key is the secret kimipd:doorTlsKey, never in the stack file."""

    # PEM: the server certificate, then its chain; it must name the router's node address.
    certificate: str
    # PEM the program's own clients (smoke test, verify, bench) verify the door against; unset:
    # the system's trust store.
    ca_certificate: str | None = None

    @field_validator("certificate", "ca_certificate")
    @classmethod
    def _pem(cls, value: str | None) -> str | None:
        if value is not None and "-----BEGIN CERTIFICATE-----" not in value:
            raise ValueError(f"{value[:40]!r}... is not a PEM certificate; paste the file's text "
                             "(-----BEGIN CERTIFICATE----- ...), e.g. with `pulumi config set "
                             "--path router.door.tls.certificate \"$(cat door.crt)\"`")
        return value


# What Linux takes for an interface name (dev_valid_name): 1-15 characters, no `/`, `:` or space.
_INTERFACE_NAME = re.compile(r"[^/:\s]{1,15}")


class VirtualIpSpec(Model):
    """The address clients use when the door stands on two nodes: one of them holds it at a time
    (VRRP, keepalived), and the other takes it when the holder or its door is lost
    (docs/vrrp-trial.md)."""

    address: str
    # keepalived (Debian 12's package, with bash) in an image pinned by digest, run on both
    # door nodes with the door's check loop beside it.
    image: str
    # Where the address is added and VRRP is spoken; unset: network.computeInterface, the one
    # the nodes' addresses are on.
    interface: str | None = None
    # The mask the address gets. 32 (the default) adds no route and never becomes the
    # interface's primary address; shorter, the nodes must be inside it.
    prefix_length: int = Field(default=32, ge=8, le=32)
    # VRRP's virtual router id, 1-255; unique among the VRRP routers of the network segment.
    vrid: int = Field(default=51, ge=1, le=255)
    # How often the holder says so; the other node takes over after about 3.5 of them without
    # an advert (VRRPv3: a multiple of 10 ms; docs/decisions.md says why 100 ms).
    advert_interval_ms: int = Field(default=100, ge=10, le=40950)

    @field_validator("address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        return checked_ipv4(value, "a free address on the door nodes' network, e.g. 174.1.60.100")

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        return checked_image_reference(value, "REPOSITORY@sha256:DIGEST, an image with Debian's "
                                              "keepalived and bash, e.g. REGISTRY/keepalived@"
                                              "sha256:...")

    @field_validator("interface")
    @classmethod
    def _interface_name(cls, value: str | None) -> str | None:
        if value is not None and not _INTERFACE_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a network interface name (1-15 characters, no "
                             "`/`, `:` or space); write it as `ip link` shows it, e.g. bond1, or "
                             "leave it unset for network.computeInterface")
        return value

    @field_validator("advert_interval_ms")
    @classmethod
    def _centiseconds(cls, value: int) -> int:
        if value % 10:
            raise ValueError(f"{value} ms is not a whole number of centiseconds, the unit VRRPv3 "
                             f"carries; write {max(10, round(value, -1))}")
        return value


class DoorSpec(Model):
    """HAProxy on the router's node owns router.port in front of two router slots, so a router
    replaced or dead costs no request (docs/door.md)."""

    # Debian 12's haproxy package in an image, pinned by digest (`sim/sim build-door-image`
    # builds one; docs/door.md says how to build yours).
    image: str
    # HAProxy's own Prometheus exporter (GET /metrics).
    metrics_port: int = Field(default=29100, ge=1, le=65535)
    # How often the door asks each slot's pair check (/health for MiniLB); two answers in a row
    # change its state.
    health_check_interval_ms: int = Field(default=500, ge=100, le=60000)
    slots: list[RouterSlotSpec] = Field(
        default=[RouterSlotSpec(port=31001, metrics_port=29001),
                 RouterSlotSpec(port=31002, metrics_port=29002)],
        min_length=2, max_length=2)
    tls: DoorTlsSpec | None = None
    # Client name -> the sha256 (hex) of the key that client sends as `Authorization: Bearer
    # KEY`: the door refuses any other key with 401 and sends the routers the internal key
    # (routerApiKey) instead, so clients never hold the key the servers take. Empty: the
    # client's own header goes through, and routerApiKey is every client's key (docs/security.md).
    client_keys: dict[str, str] = {}
    # Unset: the door stands on router.node alone. Two addresses (router.node and one more
    # member): a door and a router slot on each, and virtualIp moves between them.
    nodes: list[str] | None = Field(default=None, min_length=2, max_length=2)
    virtual_ip: VirtualIpSpec | None = None

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        return checked_image_reference(value, "REPOSITORY@sha256:DIGEST, e.g. the ref "
                                              "`sim/sim build-door-image` prints")

    @field_validator("client_keys")
    @classmethod
    def _client_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for name, digest in value.items():
            if not CLIENT_NAME.fullmatch(name) or name == PROGRAM_CLIENT:
                raise ValueError(
                    f"client name {name!r}: a client's name is 1-32 of a-z, 0-9, `.`, `_` and "
                    f"`-`, starting with a letter or digit, and not {PROGRAM_CLIENT!r} (the "
                    "program's own commands, which send routerApiKey); it names the client in "
                    "the door's log and metrics")
            if not SHA256_HEX.fullmatch(digest):
                raise ValueError(
                    f"{name}: {digest[:16]!r}... is not a sha256 in hex (64 of 0-9a-f); set the "
                    "key's digest, never the key: `printf %s \"$KEY\" | sha256sum | cut -c1-64`")
        return value

    def slot_named(self) -> dict[str, RouterSlotSpec]:
        return dict(zip(SLOT_NAMES, self.slots, strict=True))


class RouterSpec(Model):
    node: str
    # `mini-lb`: SGLang's MiniLB (a fixed worker list, random choice, no retries, no health
    # checks, no worker API; sglang-router 0.3.2, where it lives). `rust`: smg 1.13.0 (the rust
    # router's successor to sglang-router), whose worker API lets the program drain a group
    # before it is replaced, admit it once its gate passes, and pair only groups of one
    # contract.
    kind: RouterKind = DEFAULT_ROUTER_KIND
    policy: RouterPolicy = "random"
    # rust only; unset: `policy`. Decode round_robin: a retry after a dead decode goes to the
    # next group, where random or cache_aware may pick the dead one again (docs/decisions.md).
    prefill_policy: RouterPolicy | None = None
    decode_policy: RouterPolicy | None = None
    host: str = "0.0.0.0"
    port: int = Field(default=31000, ge=1, le=65535)
    # rust only: Prometheus metrics (smg_*) on this port of the router's node.
    metrics_port: int = Field(default=29000, ge=1, le=65535)
    # rust only: the longest a request may take end to end. The router's default (1800 s) lets a
    # hung prefill or decode leg hold a client for half an hour.
    request_timeout_seconds: int = Field(default=600, ge=1)
    # rust only: attempts per request (the first included); each re-picks a prefill/decode pair.
    retry_max_retries: int = Field(default=3, ge=1)
    # rust only: how fast a dead worker stops being picked (the router's defaults, every 60 s and
    # 3 failures, take 2-3 minutes).
    health_check_interval_seconds: int = Field(default=5, ge=1)
    health_failure_threshold: int = Field(default=2, ge=1)
    # rust only: how long one health check waits. A hung group keeps getting new requests for
    # about threshold x this + the interval (10.9 s measured at 2 s, 2 and 5 s); a busy SGLang
    # answers /health only at its scheduler's next output, so a shorter wait takes busy groups
    # out of rotation too (docs/decisions.md). smg's default.
    health_check_timeout_seconds: int = Field(default=5, ge=1)
    # rust only: how long a worker's circuit stays open before one trial request. smg counts a
    # pair's failure against its prefill as well, so every decode dead opens every prefill's
    # circuit; at smg's default (60 s) the router refuses for up to a minute after the decodes
    # are back (docs/decisions.md).
    circuit_breaker_timeout_seconds: int = Field(default=5, ge=1)
    # rust only: how long a drain waits for a removed group's in-flight requests to finish
    # before its containers are replaced anyway; also the router's own shutdown grace when it
    # is replaced.
    drain_timeout_seconds: int = Field(default=600, ge=0)
    # rust only: requests in flight at the router beyond which it queues, then refuses (429).
    # 0: no bound, as sglang-router 0.3.2 had (smg's default derives one from the host's cores:
    # 4096 on 2 cores); the servers queue what they cannot run (--max-running-requests).
    max_concurrent_requests: int = Field(default=0, ge=0)
    # rust only: smg leaves a worker out of routing while its waiting queue or KV use is high
    # (its default). Off: the policy alone picks, as with sglang-router 0.3.2.
    worker_overload_protection: bool = False
    extra_args: list[str] = []
    # Unset: one router on router.port. Set: the door owns router.port and two router slots
    # serve behind it (router.metricsPort is then unused: each slot has its own).
    door: DoorSpec | None = None
