"""What the model "generates": deterministic words from the prompt, on prefill, decode or null.

Prefill stores the prompt as the room's KV; decode fetches it from prefill's bootstrap server
and derives its answer from what it received, so a wrong room or a failed transfer shows up in
the answer, as it would with a real KV cache.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from .bootstrap import fetch_kv
from .contract import differences
from .http_base import RequestError, url_host

if TYPE_CHECKING:
    from .state import Standin

MAX_GEN_WORDS = 4096
DEFAULT_MAX_NEW_TOKENS = 128

VOCAB = (
    "the a of to and in is that for on with as it by at from this be are was kimi model token "
    "prefill decode cache page batch expert layer router group node rank tensor stream reply "
    "answer quick brown fox jumps over lazy dog sky river stone light sound cloud tree bird song "
    "road city map time space field wave code data graph line point value"
).split()


def count_tokens(text: Optional[str], input_ids: Optional[List[int]]) -> int:
    if input_ids is not None:
        return len(input_ids)
    return max(1, len((text or "").split()))


def generate_words(prompt: str, n: int) -> str:
    """Deterministic text of exactly n words derived from the prompt (sha256 stream)."""
    n = max(0, min(int(n), MAX_GEN_WORDS))
    words: List[str] = []
    seed = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).digest()
    block = 0
    while len(words) < n:
        digest = hashlib.sha256(seed + block.to_bytes(4, "big")).digest()
        for b in digest:
            if len(words) >= n:
                break
            words.append(VOCAB[b % len(VOCAB)])
        block += 1
    return " ".join(words)


def _bootstrap_of(req: Dict[str, Any], i: Optional[int]) -> Tuple[Any, Any, Any]:
    vals = []
    for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
        v = req.get(key)
        if i is not None and isinstance(v, list):
            v = v[i] if i < len(v) else None
        vals.append(v)
    return vals[0], vals[1], vals[2]


def prefill_seconds(st: "Standin", prompt_tokens: int) -> float:
    """Simulated prefill time (SGLANG_STANDIN_PREFILL_TOKENS_PER_S; 0 = instant)."""
    rate = st.prefill_tokens_per_s
    return prompt_tokens / rate if rate > 0 else 0.0


def token_due(st: "Standin", first_token_at: float, index: int) -> float:
    """When output token `index` (0-based) is due: the first as soon as the KV is there, each
    next one 1/SGLANG_STANDIN_DECODE_TOKENS_PER_S later (0 = all at once)."""
    rate = st.decode_tokens_per_s
    return first_token_at + (index / rate if rate > 0 else 0.0)


class Seq:
    """One sequence's share of /metrics (SGLang counts each sequence of a batch as a request):
    running from when it starts until it ends; its time to first token, from the request's
    arrival; its prompt and generated tokens once it finishes. It ends exactly once."""

    def __init__(self, st: "Standin", arrived: float, streaming: bool):
        self.st, self.arrived, self.streaming = st, arrived, streaming
        self.ended = False
        st.seq_started()

    def first_token(self, at: float) -> None:
        self.st.seq_first_token(at - self.arrived, self.streaming)

    def finish(self, meta: Dict[str, Any], generated: Optional[int] = None) -> None:
        if not self.ended:
            self.ended = True
            n = meta["completion_tokens"] if generated is None else generated
            self.st.seq_ended(self.streaming, meta["prompt_tokens"], n)

    def abort(self) -> None:
        """Stops running without being counted as served (an error, a client gone)."""
        if not self.ended:
            self.ended = True
            self.st.seq_ended(self.streaming)


def _sleep_until(st: "Standin", when: float) -> None:
    """Until a token is due, and on while the group's forward is stalled (group.py): a token of
    a hung group does not come."""
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    st.wait_flowing()


def run_one(
    st: "Standin",
    text: Optional[str],
    input_ids: Optional[List[int]],
    max_new_tokens: int,
    bhost: Any,
    bport: Any,
    broom: Any,
    pace: bool = True,
    seq: Optional[Seq] = None,
) -> Dict[str, Any]:
    """One sequence.  Returns {"text", "meta_info"}; raises RequestError.

    The stand-in never emits EOS, so every answer has exactly max_new_tokens tokens (up to
    MAX_GEN_WORDS), which is what `ignore_eos: true` guarantees on SGLang. With `pace`, a decode
    (or null) answer returns when its last token is due; without it the caller paces the tokens
    (streaming) from the moment this returns, which is when the first token exists.
    `seq` is told when the first token exists; the caller finishes or aborts it.
    """
    prompt = text if text is not None else " ".join(str(t) for t in (input_ids or []))
    prompt_tokens = count_tokens(text, input_ids)
    rid = uuid.uuid4().hex
    st.wait_flowing()  # a stalled forward takes no new work on
    meta: Dict[str, Any] = {"id": rid, "prompt_tokens": prompt_tokens, "cached_tokens": 0}
    if st.mode == "null":
        time.sleep(prefill_seconds(st, prompt_tokens))
        first_token_at = time.monotonic()
        out = generate_words(prompt, max_new_tokens)
        n = len(out.split()) if out else 0
        if seq is not None and n:
            seq.first_token(first_token_at)
        meta.update(completion_tokens=n, finish_reason={"type": "length", "length": n})
        if pace and n:
            _sleep_until(st, token_due(st, first_token_at, n - 1))
        return {"text": out, "meta_info": meta}

    if broom is None or bhost is None:
        raise RequestError(
            400,
            f"this is a {st.mode} server (--disaggregation-mode {st.mode}): requests need "
            "bootstrap_host/bootstrap_room; send them through the PD router",
        )
    kv_transfer = {"bootstrap_host": bhost, "bootstrap_port": bport, "bootstrap_room": broom}

    if st.mode == "prefill":
        if st.kv_fail_reason:
            raise RequestError(
                500,
                f"Failed to send kv chunk of room {broom}: {st.kv_fail_reason}",
                "InternalServerError",
            )
        computing = prefill_seconds(st, prompt_tokens)
        # The room is known at once (decode waits for it instead of giving up); its KV is ready
        # when prefill has computed it, which is when decode can produce the first token.
        st.kv.put(
            broom,
            {
                "bootstrap_room": broom,
                "text": text,
                "input_ids": input_ids,
                "prompt_tokens": prompt_tokens,
                "prefill_url": f"http://{url_host(st.args.host)}:{st.args.port}",
                "node_ranks": list(range(st.nnodes)),
                "created": time.time(),
                "prefill_seconds": computing,
                "kv_contract": st.kv_contract,
            },
            ready=computing == 0,
        )
        if computing:
            time.sleep(computing)
            st.wait_flowing()
            st.kv.mark_ready(broom)
        if seq is not None:  # prefill's one token (SGLang's prefill server answers with it)
            seq.first_token(time.monotonic())
        meta.update(
            completion_tokens=1,
            finish_reason={"type": "length", "length": 1},
            kv_transfer=dict(kv_transfer, role="prefill", status="sent"),
        )
        return {"text": "", "meta_info": meta}

    # decode
    if st.kv_fail_reason:
        raise RequestError(
            500,
            f"Failed to receive kv chunk for room {broom}: {st.kv_fail_reason}",
            "InternalServerError",
        )
    if st.args.disaggregation_transfer_backend == "fake":
        kv = {"text": text, "input_ids": input_ids, "bootstrap_room": broom}
    else:
        port = bport if bport not in (None, "", "none") else st.args.disaggregation_bootstrap_port
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise RequestError(400, f"invalid bootstrap_port {bport!r}")
        kv_transfer["bootstrap_port"] = port
        kv = fetch_kv(str(bhost), port, broom, st.kv_wait_seconds)
        if kv.get("text") != text or kv.get("input_ids") != input_ids:
            raise RequestError(
                500,
                f"KV of room {broom} from {bhost}:{port} does not match this request "
                f"(prefill saw {str(kv.get('text'))[:80]!r})",
                "InternalServerError",
            )
    mismatch = _contract_mismatch(st, kv.get("kv_contract"))
    st.wait_flowing()
    first_token_at = time.monotonic()
    kv_prompt = kv.get("text")
    if kv_prompt is None:
        kv_prompt = " ".join(str(t) for t in (kv.get("input_ids") or []))
    out = generate_words(kv_prompt, max_new_tokens)
    n = len(out.split()) if out else 0
    if seq is not None and n:
        seq.first_token(first_token_at)
    meta.update(
        completion_tokens=n,
        finish_reason={"type": "length", "length": n},
        kv_transfer=dict(kv_transfer, role="decode", status="received"),
    )
    if mismatch is not None:
        meta["kv_contract_mismatch"] = mismatch
    if pace and n:
        _sleep_until(st, token_due(st, first_token_at, n - 1))
    return {"text": out, "meta_info": meta}


def _contract_mismatch(st: "Standin", theirs: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Prefill's KV contract against this decode's (contract.py): None when they agree (or the
    KV carries none: the fake transfer backend); else counted, and what the answer is marked
    with."""
    ours = st.kv_contract
    if not theirs or theirs.get("digest") == ours["digest"]:
        return None
    with st.lock:
        st.kv_contract_mismatches += 1
    return {"prefill": theirs.get("digest"), "decode": ours["digest"],
            "differs": differences(ours, theirs)}


def generate(st: "Standin", req: Dict[str, Any], arrived: Optional[float] = None) -> Any:
    """POST /generate (single or batch). `arrived`: when the request came (time.monotonic())."""
    results, batch, _ = _generate(st, req, pace=True, arrived=arrived, streaming=False)
    return results if batch else results[0]


class EventStream:
    """The events of a streamed /generate. Iterate it, then close() it whatever happened: a
    sequence is counted as served when its last event has been handed over; close() stops the
    ones that never got there (the client went away)."""

    def __init__(self, events: Iterator[Dict[str, Any]], seqs: List[Seq]):
        self._events, self._seqs = events, seqs

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self._events

    def close(self) -> None:
        self._events.close()  # type: ignore[attr-defined]
        for seq in self._seqs:
            seq.abort()


def generate_stream(st: "Standin", req: Dict[str, Any],
                    arrived: Optional[float] = None) -> EventStream:
    """POST /generate with `"stream": true`, chunked as SGLang does: one event per output token
    with the cumulative `text` and `meta_info` (completion_tokens so far, finish_reason on the
    last), `index` naming the sequence of a batch. Prefill and the KV fetch happen before this
    returns, so their failures are HTTP errors, not events."""
    results, _, seqs = _generate(st, req, pace=False, arrived=arrived, streaming=True)
    first_token_at = time.monotonic()

    def events() -> Iterator[Dict[str, Any]]:
        if st.mode == "prefill":
            for seq, res in zip(seqs, results):
                yield res
                seq.finish(res["meta_info"])
            return
        words = [res["text"].split() for res in results]
        longest = max((len(w) for w in words), default=0)
        for index, res in enumerate(results):
            if not words[index]:
                yield dict(res, index=index)
                seqs[index].finish(res["meta_info"], 0)
        for i in range(longest):
            _sleep_until(st, token_due(st, first_token_at, i))
            for index, res in enumerate(results):
                if i >= len(words[index]):
                    continue
                last = i + 1 == len(words[index])
                meta = dict(res["meta_info"], completion_tokens=i + 1,
                            finish_reason=res["meta_info"]["finish_reason"] if last else None)
                yield {"text": " ".join(words[index][: i + 1]), "meta_info": meta,
                       "index": index}
                if last:
                    seqs[index].finish(res["meta_info"])

    return EventStream(events(), seqs)


def _run_all(st: "Standin", jobs: List[Tuple[Any, ...]], max_new: int, pace: bool,
             arrived: Optional[float], streaming: bool
             ) -> Tuple[List[Dict[str, Any]], List[Seq]]:
    """run_one for each (text, input_ids, bootstrap...) in turn, each with its Seq. With `pace`
    a sequence is served when run_one returns, else the caller finishes it. On an error every
    Seq started so far stops running before the error goes on."""
    arrived = time.monotonic() if arrived is None else arrived
    results: List[Dict[str, Any]] = []
    seqs: List[Seq] = []
    try:
        for text, input_ids, *boot in jobs:
            seqs.append(Seq(st, arrived, streaming))
            results.append(run_one(st, text, input_ids, max_new, *boot, pace=pace,
                                   seq=seqs[-1]))
            if pace:
                seqs[-1].finish(results[-1]["meta_info"])
    except BaseException:
        for seq in seqs:
            seq.abort()
        raise
    return results, seqs


def _generate(st: "Standin", req: Dict[str, Any], pace: bool, arrived: Optional[float] = None,
              streaming: bool = False) -> Tuple[List[Dict[str, Any]], bool, List[Seq]]:
    text = req.get("text")
    input_ids = req.get("input_ids")
    sp = req.get("sampling_params") or {}
    if isinstance(sp, list):
        sp = sp[0] if sp else {}
    max_new = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    try:
        max_new = int(max_new if max_new is not None else DEFAULT_MAX_NEW_TOKENS)
    except (TypeError, ValueError):
        raise RequestError(400, f"invalid max_new_tokens {max_new!r}")
    if text is None and input_ids is None:
        raise RequestError(400, "Either text or input_ids should be provided.")
    if isinstance(text, list) or (
        input_ids is not None and input_ids and isinstance(input_ids[0], list)
    ):
        texts = text if isinstance(text, list) else [None] * len(input_ids)
        ids = input_ids if input_ids is not None else [None] * len(texts)
        jobs = [(t, x, *_bootstrap_of(req, i)) for i, (t, x) in enumerate(zip(texts, ids))]
        batch = True
    else:
        jobs = [(text, input_ids, *_bootstrap_of(req, None))]
        batch = False
    results, seqs = _run_all(st, jobs, max_new, pace, arrived, streaming)
    return results, batch, seqs


def completions(st: "Standin", req: Dict[str, Any], chat: bool,
                arrived: Optional[float] = None) -> Dict[str, Any]:
    """POST /v1/completions and /v1/chat/completions, on the same path as /generate."""
    if chat:
        msgs = req.get("messages") or []
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            parts.append(f"{m.get('role', 'user') if isinstance(m, dict) else 'user'}: {c or ''}")
        prompt = "\n".join(parts)
    else:
        prompt = req.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
    max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or 16
    (res,), _ = _run_all(st, [(prompt, None, *_bootstrap_of(req, None))], int(max_tokens),
                         True, arrived, bool(req.get("stream")))
    meta = res["meta_info"]
    usage = {
        "prompt_tokens": meta["prompt_tokens"],
        "completion_tokens": meta["completion_tokens"],
        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
    }
    base = {
        "id": meta["id"],
        "created": int(time.time()),
        "model": req.get("model") or st.args.served_model_name,
        "usage": usage,
    }
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": res["text"]},
            "finish_reason": "length",
        }
        return dict(base, object="chat.completion", choices=[choice])
    choice = {"index": 0, "text": res["text"], "finish_reason": "length", "logprobs": None}
    return dict(base, object="text_completion", choices=[choice])
