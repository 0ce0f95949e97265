"""The serving contract: what every prefill and decode group the router may pair must share for
the KV cache one hands the other to mean the same thing to both (config/rules/kv_contract.py
refuses groups that disagree). Its digest goes with each group's admission, and the router's
node keeps the groups of one contract per router (assets/router-members.py): a rollout of a new
one never pairs a prefill and a decode of two (docs/decisions.md)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from ..config import ClusterConfig
from ..config.rules.kv_contract import CONTRACT_FLAGS, DEFAULTS, kv_contract


def serving_contract(cfg: ClusterConfig, node_file_digests: Mapping[str, str]) -> dict[str, object]:
    """What both modes must run alike: the image (SGLang and its KV transfer), the node files
    (the Mooncake wheel, the patches), the model, and the KV settings every group's extraArgs
    give (or SGLang's defaults). Not --context-length: decode's may be longer than prefill's."""
    kv: dict[str, object] = {}
    for dest in (*CONTRACT_FLAGS, "transfer_backend"):
        values = sorted({str(setting.value or DEFAULTS.get(dest) or "")
                         for name, group in cfg.groups.items()
                         for setting in [kv_contract(name, group)[dest]]})
        # One value where the groups agree (the preview refuses them otherwise).
        kv[dest] = values[0] if len(values) == 1 else values
    return {
        "image": cfg.image,
        "nodeFiles": dict(sorted(node_file_digests.items())),
        "model": {"path": cfg.model.path, "servedModelName": cfg.model.served_model_name},
        "kv": kv,
    }


def contract_digest(contract: Mapping[str, object]) -> str:
    """A short, stable name of CONTRACT (what the router's node compares)."""
    return hashlib.sha256(json.dumps(contract, sort_keys=True).encode()).hexdigest()[:16]


FINGERPRINT_LINE = re.compile(r"^model fingerprint: ([0-9a-f]{12})$", re.MULTILINE)


def model_fingerprint(gate_stdout: str) -> str | None:
    """The checkpoint's fingerprint rank 0's gate printed (assets/wait-healthy.sh), None where no
    mount puts the model on the node (the image carries it) or it was unreadable."""
    found = FINGERPRINT_LINE.search(gate_stdout or "")
    return found.group(1) if found else None


def running_contract(digest: str, image_id: str, fingerprint: str | None = None) -> str:
    """What a group's admission declares: the config's contract, the image its rank 0's node
    really holds under the config's reference (docker's id of its content), and the checkpoint
    it loaded (FINGERPRINT: its config and index files, every file's name and size, read on the
    node once it is healthy). A tag re-pushed and pulled on some nodes, or weights rewritten
    in place under model.path and loaded by the groups restarted since, are the same config with
    other contents: those groups then run another contract, never paired with the rest."""
    declared = f"{digest}-{image_id.removeprefix('sha256:')[:12]}"
    return f"{declared}-{fingerprint}" if fingerprint else declared
