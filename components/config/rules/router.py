"""The router section's own rules."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig


def router_policy(cfg: ClusterConfig) -> Iterable[str]:
    if cfg.router.kind == "mini-lb" and cfg.router.policy != "random":
        yield (f"router.policy: {cfg.router.policy!r} is ignored by MiniLB, which always picks at "
               "random; set router.kind to 'rust' or remove router.policy.")


# Keys only the rust router reads; set with MiniLB they would silently do nothing.
RUST_ONLY = (("prefill_policy", "prefillPolicy"), ("decode_policy", "decodePolicy"))


def rust_only_keys(cfg: ClusterConfig) -> Iterable[str]:
    if cfg.router.kind != "mini-lb":
        return
    for field, key in RUST_ONLY:
        value = getattr(cfg.router, field)
        if value is not None:
            yield (f"router.{key}: {value!r} is ignored by MiniLB, which always picks at random; "
                   f"set router.kind to 'rust' or remove router.{key}.")
