"""The KV contract as the stand-in knows it from its own flags: a test oracle of the sim, not
SGLang's behaviour.

SGLang 0.5.19 moves KV pages as raw bytes and does not compare the two sides' layouts outside
`--enable-unified-memory` (srt/disaggregation/mooncake/conn.py, `_validate_envelope_kv_layout`),
so a prefill and a decode that disagree answer 200 with silently wrong text. The stand-in cannot
be wrong that way; instead prefill's KV carries a digest of its contract, and a decode that
receives KV of another contract counts it (`sglang:standin_kv_contract_mismatch_total`) and marks
its answer (`meta_info.kv_contract_mismatch`), so that a test sees what a real cluster would have
got wrong (docs/decisions.md: what is in the contract).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List

# The flags both sides must share (as components/config/rules/kv_contract.py checks them at
# preview), and the model they serve. SGLang's default where a flag is not given.
FIELDS = ("model_path", "served_model_name", "revision", "tokenizer_path", "dtype",
          "quantization", "kv_cache_dtype", "page_size", "speculative_algorithm",
          "disaggregation_transfer_backend")
DEFAULTS = {"dtype": "auto", "kv_cache_dtype": "auto"}
# What the sim's image records of its build (sim/sim): another image is another contract.
IMAGE_RECORD = Path("/etc/kimipd-sim-image")


def _image() -> str | None:
    try:
        lines = IMAGE_RECORD.read_text().splitlines()
    except OSError:
        return None
    return next((line.split("=", 1)[1] for line in lines if line.startswith("inputs=")), None)


def contract_of(args: Any) -> Dict[str, Any]:
    """The contract's fields from ARGS (the parsed launch flags) and the image, with its digest."""
    fields: Dict[str, Any] = {}
    for name in FIELDS:
        value = getattr(args, name, None)
        fields[name] = DEFAULTS.get(name) if value is None else str(value)
    fields["image"] = _image()
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return {"digest": digest, "fields": fields}


def differences(ours: Dict[str, Any], theirs: Dict[str, Any]) -> List[str]:
    """The fields in which two contracts differ, by name."""
    mine, other = ours.get("fields") or {}, theirs.get("fields") or {}
    return sorted(name for name in set(mine) | set(other) if mine.get(name) != other.get(name))
