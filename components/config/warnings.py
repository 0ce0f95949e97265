"""Warnings: deployable, but probably not what the operator meant (`pulumi preview` shows them)."""

from __future__ import annotations

from .cluster_config import ClusterConfig
from ..cli_spec import sglang_table

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
