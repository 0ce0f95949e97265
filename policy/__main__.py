"""`pulumi preview --policy-pack policy`: the pack itself. Building the PolicyPack starts the
policy SDK's gRPC server, so it is built only here (the rules are tested in rules.py's tests)."""

import sys
from pathlib import Path

# pulumi-policy is the pack's own requirement (policy/requirements.txt, in policy/venv), not in the
# program's venv the type checker reads: its protobuf~=5.29 would pin the program's protobuf back.
from pulumi_policy import (  # pyright: ignore[reportMissingImports]
    EnforcementLevel, PolicyConfigSchema, PolicyPack, ResourceValidationPolicy)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rules  # noqa: E402  (beside this file; the pack runs as a script)

MANDATORY = EnforcementLevel.MANDATORY

PolicyPack(
    name="kimipd",
    enforcement_level=MANDATORY,
    policies=[
        ResourceValidationPolicy(
            name="kimipd-no-expandable-segments",
            description="No expandable_segments:True under PYTORCH_CUDA_ALLOC_CONF or "
                        "PYTORCH_ALLOC_CONF (Mooncake RDMA registration fails).",
            validate=rules.validate_no_expandable_segments),
        ResourceValidationPolicy(
            name="kimipd-nccl-off-management",
            description="NCCL/GLOO socket interfaces never reach the management interface.",
            validate=rules.validate_nccl_off_management,
            config_schema=PolicyConfigSchema(properties={
                "managementInterface": {"type": "string",
                                        "default": rules.DEFAULT_MANAGEMENT_INTERFACE}})),
        ResourceValidationPolicy(
            name="kimipd-no-nixl",
            description="No nixl disaggregation transfer backend (fails above ~20 MB here).",
            validate=rules.validate_no_nixl),
        ResourceValidationPolicy(
            name="kimipd-restart-no",
            description="Ranks of multi-node groups use restart policy `no`.",
            validate=rules.validate_restart_no),
        ResourceValidationPolicy(
            name="kimipd-no-privileged",
            description="No privileged container unless this pack's config allows it.",
            validate=rules.validate_no_privileged,
            config_schema=PolicyConfigSchema(properties={
                "allowPrivileged": {"type": "boolean", "default": False}})),
    ],
)
