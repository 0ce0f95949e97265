"""Values a shipped stack file leaves for the operator to fill in. The model accepts them, so the
test suite loads every stack file as it is; the program refuses them before the first resource,
saying what to put there instead."""

from __future__ import annotations

from .cluster_config import ClusterConfig
from .grammars import IMAGE_REFERENCE

# `.invalid` never resolves (RFC 2606): docker could not pull such an image from anywhere.
PLACEHOLDER_DOMAIN = ".invalid"
# What Pulumi.pro6000.yaml names for keepalived's image: there is no official one
# (docs/decisions.md), so the operator builds it into their registry.
KEEPALIVED_IMAGE_PLACEHOLDER = "registry.invalid/kimipd/keepalived:build-it"


def is_placeholder(image: str) -> bool:
    match = IMAGE_REFERENCE.fullmatch(image)
    domain = (match.group("domain") or "") if match else ""
    return domain.split(":")[0].endswith(PLACEHOLDER_DOMAIN)


def placeholder_refusals(cfg: ClusterConfig, stack: str) -> list[str]:
    """Why the program must not deploy STACK yet: one line per placeholder, naming the key, the
    value and the fix."""
    door = cfg.router.door
    if door is None or door.nodes is None or door.virtual_ip is None:
        return []
    image = door.virtual_ip.image
    if not is_placeholder(image):
        return []
    return [f"router.door.virtualIp.image: {image!r} is a placeholder (there is no official "
            "keepalived image); build one into your registry with `scripts/build-keepalived-image "
            "REGISTRY/kimipd/keepalived` (Debian 12's keepalived and bash) and set the "
            "REPO@DIGEST it prints: pulumi config set --path router.door.virtualIp.image REF "
            f"-s {stack}"]
