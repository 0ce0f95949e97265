"""The KV contract: what a prefill and a decode group must agree on for the KV cache one hands
the other to mean the same thing to both.

SGLang 0.5.19 moves KV pages between the modes as raw bytes, at offsets each side computes from
its own layout (page size, KV dtype, the model's shapes); it checks the peer's layout only on the
`--enable-unified-memory` path (srt/disaggregation/mooncake/conn.py,
`_validate_envelope_kv_layout`). Both sides also tokenize the prompt themselves, and decode
continues from prefill's KV with its own weights. A pair that disagrees serves 200s whose text
is silently wrong, so every prefill group the router may pair with every decode group is checked
before anything is touched. TP sizes may differ: SGLang reslices the heads (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...cli_spec import sglang_table

if TYPE_CHECKING:
    from ..cluster_config import ClusterConfig
    from ..schema import GroupSpec

# SGLang's flags in the contract, by dest, with what a disagreement does.
CONTRACT_FLAGS = {
    "kv_cache_dtype": "the KV pages' element type, so decode reads prefill's bytes as other "
                      "numbers",
    "page_size": "the KV pages' size, so decode reads prefill's pages at the wrong offsets",
    "dtype": "the weights' and activations' type, so decode continues prefill's KV with "
             "another model",
    "quantization": "the weights' quantization, so decode continues prefill's KV with another "
                    "model",
    "revision": "the checkpoint's revision, so decode continues prefill's KV with other weights",
    "tokenizer_path": "the tokenizer, so decode's prompt tokens are not the ones prefill's KV "
                      "holds",
    "speculative_algorithm": "speculative decoding, whose draft KV prefill hands over too",
}
# --context-length: decode's may be longer than prefill's (it holds the output as well), never
# shorter: a prompt prefill accepts would not fit decode's KV.
CONTEXT_LENGTH = "context_length"
# The attention backends, which snap the page size (resolved_page_size).
BACKENDS = ("attention_backend", "decode_attention_backend", "prefill_attention_backend",
            "speculative_draft_attention_backend")
# SGLang 0.5.19's page-size snaps, in the order it applies them
# (srt/arg_groups/overrides.py, `_mla_backend_page_constraints`): backend -> (the backend flags
# it is looked for in, the sizes it keeps, the size it snaps any other to).
ALL_BACKENDS = BACKENDS[:3]
PAGE_SNAPS: tuple[tuple[str, tuple[str, ...], tuple[int, ...], int], ...] = (
    ("flashmla", BACKENDS[:2], (), 64),
    ("cutlass_mla", BACKENDS[:2], (), 128),
    ("trtllm_mla", BACKENDS[:2], (32, 64), 64),
    ("tokenspeed_mla", BACKENDS[:2], (32, 64), 64),
    ("cutedsl_mla", ALL_BACKENDS, (32, 64), 64),
    ("trtllm_mha", BACKENDS, (16, 32, 64, 128), 64),
    ("hpc_ops", ALL_BACKENDS, (64,), 64),
)
# SGLang's own default where a flag is not given, so that "auto" and nothing agree.
DEFAULTS = {"kv_cache_dtype": "auto", "dtype": "auto"}


@dataclass(frozen=True)
class Setting:
    value: str | None  # as written; None: not given (SGLang's default)
    where: str  # the key that sets it, for the message

    def shown(self, dest: str) -> str:
        if self.value is None:
            default = DEFAULTS.get(dest)
            return (f"SGLang's default {default!r}" if default is not None
                    else "not set (SGLang's default)")
        return f"{self.value!r} ({self.where})"


def resolved_page_size(page_size: str | None, backends: dict[str, str | None]) -> str | None:
    """The page size SGLang 0.5.19 runs with, from --page-size and the attention backend flags
    as given: each backend that supports only some sizes snaps it (PAGE_SNAPS), and an unset
    one is then 1. None when no backend is given: SGLang picks one by the GPU and the model at
    start, so only the running server can tell (its /server_info)."""
    if not any(backends.values()):
        return page_size
    size: int | None = int(page_size) if page_size and page_size.isdigit() else None
    for backend, flags, keeps, snap in PAGE_SNAPS:
        if any(backends.get(flag) == backend for flag in flags) and size not in keeps:
            size = snap
    return str(size if size is not None else 1)


def _given(key: str, args: list[str]) -> dict[str, Setting]:
    """dest -> the last occurrence's value (argparse keeps the last) among the contract's flags."""
    found: dict[str, Setting] = {}
    wanted = {*CONTRACT_FLAGS, CONTEXT_LENGTH, *BACKENDS}
    for occurrence in sglang_table().occurrences(args):
        dest = occurrence.option.dest
        if dest not in wanted:
            continue
        value = occurrence.value(args)
        if value is not None:  # a missing value is extra_args_parse's to report
            found[dest] = Setting(value, f"{key}[{occurrence.index}]")
    return found


def kv_contract(name: str, group: GroupSpec) -> dict[str, Setting]:
    """GROUP's side of the contract: each contract flag as its extraArgs give it (or not), and
    its transfer backend. The model and the image are the stack's, the same for every group."""
    key = f"groups.{name}.extraArgs"
    given = _given(key, group.extra_args)
    contract = {dest: given.get(dest, Setting(None, key))
                for dest in (*CONTRACT_FLAGS, CONTEXT_LENGTH)}
    # The page size as SGLang resolves it: a backend that snaps it changes the KV layout as
    # much as --page-size does.
    backends = {dest: given[dest].value for dest in BACKENDS if dest in given}
    resolved = resolved_page_size(contract["page_size"].value, backends)
    if resolved != contract["page_size"].value:
        named = ", ".join(f"--{dest.replace('_', '-')} {value}"
                          for dest, value in backends.items())
        contract["page_size"] = Setting(resolved, f"{key}: {named} snaps it")
    contract["transfer_backend"] = Setting(group.transfer_backend,
                                           f"groups.{name}.transferBackend")
    return contract


def _same(dest: str, one: Setting, other: Setting) -> bool:
    default = DEFAULTS.get(dest)
    return (one.value or default) == (other.value or default)


def _tokens(value: str) -> float | None:
    """--context-length as SGLang reads it (an int, or with a k/m suffix); None if unreadable."""
    text = value.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    try:
        return float(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        return None


def prefill_and_decode_agree(cfg: ClusterConfig) -> Iterable[str]:
    contracts = {name: kv_contract(name, group) for name, group in cfg.groups.items()}
    prefills = [name for name, group in cfg.groups.items() if group.mode == "prefill"]
    decodes = [name for name, group in cfg.groups.items() if group.mode == "decode"]
    for prefill in prefills:
        for decode in decodes:
            ours, theirs = contracts[prefill], contracts[decode]
            for dest, effect in (*CONTRACT_FLAGS.items(),
                                 ("transfer_backend", "how the KV crosses between them")):
                if _same(dest, ours[dest], theirs[dest]):
                    continue
                flag = (f"--{dest.replace('_', '-')}" if dest != "transfer_backend"
                        else "transferBackend")
                yield (f"groups.{prefill} and groups.{decode} disagree on the KV hand-off: "
                       f"{flag} is {ours[dest].shown(dest)} on {prefill} and "
                       f"{theirs[dest].shown(dest)} on {decode}; that is {effect}, and every "
                       f"answer would be silently wrong (SGLang does not compare the two): set "
                       f"the same {flag} on both groups"
                       + (" (an attention backend snaps it: give both the size it snaps to, "
                          "or the same backends)." if dest == "page_size" else "."))
            mine, yours = ours[CONTEXT_LENGTH], theirs[CONTEXT_LENGTH]
            if yours.value is None:
                continue  # decode's default is the model's whole context: never shorter
            mine_tokens = None if mine.value is None else _tokens(mine.value)
            yours_tokens = _tokens(yours.value)
            if yours_tokens is not None and mine_tokens is not None and yours_tokens >= mine_tokens:
                continue
            yield (f"groups.{prefill} and groups.{decode} disagree on the KV hand-off: "
                   f"--context-length is {mine.shown(CONTEXT_LENGTH)} on {prefill} and "
                   f"{yours.shown(CONTEXT_LENGTH)} on {decode}; a prompt prefill accepts would "
                   f"not fit decode's KV: give {decode} a --context-length at least "
                   f"{prefill}'s (or neither group one).")
