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
