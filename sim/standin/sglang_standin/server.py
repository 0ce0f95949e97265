"""SGLang stand-in: an HTTP server that behaves like `python3 -m sglang.launch_server` on a GPU node.

Stdlib only.  What it simulates (see README.md in this directory):
  * model loading (a sleep), readiness on /health, the fired-up banner;
  * a multi-node group: rank 0 listens on --dist-init-addr, ranks >= 1 connect and hold the
    connection; a lost peer breaks the group for good (rank 0 -> 503, ranks >= 1 exit non-zero,
    and rank 0 exits too once its watchdog fires, as SGLang's does on a hung collective);
  * PD disaggregation: prefill rank 0 runs the bootstrap server (PUT/GET /route and a KV store at
    GET /kv/<room>); decode fetches the "KV" of each request from there before it answers.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from . import __version__
from .args import parse_args

READY_BANNER = "The server is fired up and ready to roll!"
MAX_GEN_WORDS = 4096
KV_STORE_CAPACITY = 10000
DEFAULT_MAX_NEW_TOKENS = 128

VOCAB = (
    "the a of to and in is that for on with as it by at from this be are was kimi model token "
    "prefill decode cache page batch expert layer router group node rank tensor stream reply "
    "answer quick brown fox jumps over lazy dog sky river stone light sound cloud tree bird song "
    "road city map time space field wave code data graph line point value"
).split()


# --------------------------------------------------------------------------------------------
# logging


_LOG_LOCK = threading.RLock()  # re-entrant: the signal handler logs too
_LOG_PREFIX = "standin"


def log(msg: str, err: bool = False) -> None:
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    line = f"[{ts} {_LOG_PREFIX}] {msg}"
    with _LOG_LOCK:
        stream = sys.stderr if err else sys.stdout
        try:
            print(line, file=stream, flush=True)
        except (BrokenPipeError, ValueError, OSError):
            pass


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        log(f"WARNING: ignoring {name}={raw!r}: not a number", err=True)
        return default


def _env_ranks(name: str) -> List[int]:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return []
    out = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            log(f"WARNING: ignoring {name} entry {part!r}: not an integer rank", err=True)
    return out


def _die(msg: str, code: int = 1) -> None:
    log(msg, err=True)
    os._exit(code)


# --------------------------------------------------------------------------------------------
# "generation"


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


def _url_host(host: str) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


class RequestError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


# --------------------------------------------------------------------------------------------
# the server state


class Standin:
    def __init__(self, args):
        self.args = args
        self.rank: int = args.node_rank
        self.nnodes: int = args.nnodes
        self.mode: str = args.disaggregation_mode
        self.load_seconds = max(0.0, _env_float("SGLANG_STANDIN_LOAD_SECONDS", 2.0))
        self.exit_while_loading = self.rank in _env_ranks("SGLANG_STANDIN_EXIT_WHILE_LOADING")
        self.kv_wait_seconds = max(0.0, _env_float("SGLANG_STANDIN_KV_WAIT_SECONDS", 5.0))
        self.dist_timeout = max(0.0, _env_float("SGLANG_STANDIN_DIST_TIMEOUT", 600.0))
        self.bootstrap_timeout = max(0.0, _env_float("SGLANG_STANDIN_BOOTSTRAP_TIMEOUT", 60.0))
        # Seconds rank 0 lives on after losing a peer (SGLang: the watchdog on the hung
        # collective kills the server); 0 or less keeps it alive and unhealthy.
        self.watchdog_seconds = _env_float("SGLANG_STANDIN_WATCHDOG_SECONDS", 10.0)
        self.kv_fail_reason: Optional[str] = None
        if os.environ.get("SGLANG_STANDIN_KV_FAIL", "").strip() not in ("", "0", "false"):
            self.kv_fail_reason = "SGLANG_STANDIN_KV_FAIL is set (stand-in fault injection)"
        elif (
            "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()
            and args.disaggregation_transfer_backend == "mooncake"
            and self.mode != "null"
        ):
            # Mooncake issues #351/#2511: registration fails, the server still looks healthy, and
            # every KV transfer fails.
            self.kv_fail_reason = (
                "Failed to register memory: Bad address "
                "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with Mooncake)"
            )

        self.lock = threading.Lock()
        self.loaded = threading.Event()
        # Set once the ready banner is printed: /health turns 200 only after it, as in SGLang,
        # so a log read after a 200 always shows the banner.
        self.announced = threading.Event()
        self.start_time = time.time()
        self.ready_since: Optional[float] = None
        self.broken: Optional[str] = None
        self.peers: Dict[int, socket.socket] = {}
        self.joined_once: set = set()
        self.registrations: Dict[str, Dict[str, Any]] = {}
        self.kv: "OrderedDict[str, Dict[str, Any]]" = OrderedDict()
        self.num_requests = 0
        self.num_kv_sent = 0
        self.num_kv_received = 0
        self.http_server: Optional[ThreadingHTTPServer] = None
        self.bootstrap_server: Optional[ThreadingHTTPServer] = None
        self.group_listener: Optional[socket.socket] = None
        self.shutdown = threading.Event()

    # ---------------- readiness

    def all_peers_joined(self) -> bool:
        with self.lock:
            return len(self.peers) == self.nnodes - 1

    def all_prefill_registered(self) -> bool:
        if self.mode != "prefill":
            return True
        with self.lock:
            ranks = {r.get("node_rank") for r in self.registrations.values()}
        return all(r in ranks for r in range(self.nnodes))

    def not_ready_reason(self) -> Optional[str]:
        if self.broken:
            return f"group broken: {self.broken}"
        if not self.all_peers_joined():
            with self.lock:
                missing = sorted(set(range(1, self.nnodes)) - set(self.peers))
            return f"waiting for node ranks {missing} to join the group"
        if not self.loaded.is_set():
            return "loading model"
        if not self.all_prefill_registered():
            return "waiting for prefill ranks to register with the bootstrap server"
        if not self.announced.is_set():
            return "warming up"
        return None

    # ---------------- info dicts

    def server_info(self) -> Dict[str, Any]:
        info = {k: v for k, v in vars(self.args).items()}
        info.update(
            {
                "version": "standin",
                "standin_version": __version__,
                "status": "ready" if self.not_ready_reason() is None else "not_ready",
                "not_ready_reason": self.not_ready_reason(),
                "group_broken": self.broken,
                "connected_node_ranks": [0] + sorted(self.peers),
                "bootstrap_registrations": len(self.registrations),
                "num_requests": self.num_requests,
                "internal_states": [
                    {"last_gen_throughput": 0.0, "avg_spec_accept_length": None}
                ],
            }
        )
        return info

    def model_info(self) -> Dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "served_model_name": self.args.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "standin",
            "architectures": ["StandinForCausalLM"],
        }

    def models_list(self) -> Dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.args.served_model_name,
                    "object": "model",
                    "created": int(self.start_time),
                    "owned_by": "sglang",
                    "root": self.args.model_path,
                    "max_model_len": self.args.context_length or 131072,
                }
            ],
        }

    def metrics_text(self) -> str:
        name = self.args.served_model_name
        lbl = f'{{model_name="{name}"}}'
        ready = 1 if self.not_ready_reason() is None else 0
        return (
            f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{lbl} 0\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{lbl} 0\n"
            f"# TYPE sglang:standin_requests_total counter\n"
            f"sglang:standin_requests_total{lbl} {self.num_requests}\n"
            f"# TYPE sglang:standin_ready gauge\nsglang:standin_ready{lbl} {ready}\n"
        )

    # ---------------- KV store (prefill rank 0)

    def kv_put(self, room: Any, entry: Dict[str, Any]) -> None:
        with self.lock:
            self.kv[str(room)] = entry
            self.kv.move_to_end(str(room))
            while len(self.kv) > KV_STORE_CAPACITY:
                self.kv.popitem(last=False)
            self.num_kv_sent += 1

    def kv_get(self, room: str) -> Optional[Dict[str, Any]]:
        with self.lock:
            return self.kv.get(room)

    def fetch_kv(self, host: str, port: int, room: Any) -> Dict[str, Any]:
        """Decode side: fetch the KV of `room` from the prefill bootstrap server (with retries)."""
        url = f"http://{_url_host(host)}:{port}/kv/{room}"
        deadline = time.monotonic() + self.kv_wait_seconds
        delay = 0.02
        last = "no attempt"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=max(1.0, self.kv_wait_seconds)) as resp:
                    data = json.loads(resp.read().decode("utf-8"))
                    with self.lock:
                        self.num_kv_received += 1
                    return data
            except urllib.error.HTTPError as e:
                body = e.read().decode("utf-8", "replace")[:300]
                last = f"HTTP {e.code} from {url}: {body}"
                if e.code != 404:
                    break  # the prefill side reported a failure: do not wait for it
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
                last = f"{type(e).__name__} from {url}: {e}"
            if time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        raise RequestError(
            500,
            f"Failed to receive kv chunk for room {room} from prefill bootstrap "
            f"{host}:{port}: {last}",
            "InternalServerError",
        )

    # ---------------- inference

    def _bootstrap_of(self, req: Dict[str, Any], i: Optional[int]) -> Tuple[Any, Any, Any]:
        vals = []
        for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
            v = req.get(key)
            if i is not None and isinstance(v, list):
                v = v[i] if i < len(v) else None
            vals.append(v)
        return vals[0], vals[1], vals[2]

    def run_one(
        self,
        text: Optional[str],
        input_ids: Optional[List[int]],
        max_new_tokens: int,
        bhost: Any,
        bport: Any,
        broom: Any,
    ) -> Dict[str, Any]:
        """One sequence.  Returns {"text", "meta_info"}; raises RequestError."""
        prompt = text if text is not None else " ".join(str(t) for t in (input_ids or []))
        prompt_tokens = count_tokens(text, input_ids)
        rid = uuid.uuid4().hex
        meta: Dict[str, Any] = {"id": rid, "prompt_tokens": prompt_tokens, "cached_tokens": 0}
        if self.mode == "null":
            out = generate_words(prompt, max_new_tokens)
            n = len(out.split()) if out else 0
            meta.update(completion_tokens=n, finish_reason={"type": "length", "length": n})
            return {"text": out, "meta_info": meta}

        if broom is None or bhost is None:
            raise RequestError(
                400,
                f"this is a {self.mode} server (--disaggregation-mode {self.mode}): requests need "
                "bootstrap_host/bootstrap_room; send them through the PD router",
            )
        kv_transfer = {"bootstrap_host": bhost, "bootstrap_port": bport, "bootstrap_room": broom}

        if self.mode == "prefill":
            if self.kv_fail_reason:
                raise RequestError(
                    500,
                    f"Failed to send kv chunk of room {broom}: {self.kv_fail_reason}",
                    "InternalServerError",
                )
            self.kv_put(
                broom,
                {
                    "bootstrap_room": broom,
                    "text": text,
                    "input_ids": input_ids,
                    "prompt_tokens": prompt_tokens,
                    "prefill_url": f"http://{_url_host(self.args.host)}:{self.args.port}",
                    "node_ranks": list(range(self.nnodes)),
                    "created": time.time(),
                },
            )
            meta.update(
                completion_tokens=1,
                finish_reason={"type": "length", "length": 1},
                kv_transfer=dict(kv_transfer, role="prefill", status="sent"),
            )
            return {"text": "", "meta_info": meta}

        # decode
        if self.kv_fail_reason:
            raise RequestError(
                500,
                f"Failed to receive kv chunk for room {broom}: {self.kv_fail_reason}",
                "InternalServerError",
            )
        if self.args.disaggregation_transfer_backend == "fake":
            kv = {"text": text, "input_ids": input_ids, "bootstrap_room": broom}
        else:
            port = bport if bport not in (None, "", "none") else self.args.disaggregation_bootstrap_port
            try:
                port = int(port)
            except (TypeError, ValueError):
                raise RequestError(400, f"invalid bootstrap_port {bport!r}")
            kv_transfer["bootstrap_port"] = port
            kv = self.fetch_kv(str(bhost), port, broom)
            if kv.get("text") != text or kv.get("input_ids") != input_ids:
                raise RequestError(
                    500,
                    f"KV of room {broom} from {bhost}:{port} does not match this request "
                    f"(prefill saw {str(kv.get('text'))[:80]!r})",
                    "InternalServerError",
                )
        kv_prompt = kv.get("text")
        if kv_prompt is None:
            kv_prompt = " ".join(str(t) for t in (kv.get("input_ids") or []))
        out = generate_words(kv_prompt, max_new_tokens)
        n = len(out.split()) if out else 0
        meta.update(
            completion_tokens=n,
            finish_reason={"type": "length", "length": n},
            kv_transfer=dict(kv_transfer, role="decode", status="received"),
        )
        return {"text": out, "meta_info": meta}

    def generate(self, req: Dict[str, Any]) -> Any:
        """POST /generate (single or batch)."""
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
            seqs = text if isinstance(text, list) else [None] * len(input_ids)
            ids = input_ids if input_ids is not None else [None] * len(seqs)
            return [
                self.run_one(t, x, max_new, *self._bootstrap_of(req, i))
                for i, (t, x) in enumerate(zip(seqs, ids))
            ]
        return self.run_one(text, input_ids, max_new, *self._bootstrap_of(req, None))

    def completions(self, req: Dict[str, Any], chat: bool) -> Dict[str, Any]:
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
        res = self.run_one(prompt, None, int(max_tokens), *self._bootstrap_of(req, None))
        meta = res["meta_info"]
        usage = {
            "prompt_tokens": meta["prompt_tokens"],
            "completion_tokens": meta["completion_tokens"],
            "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        }
        base = {
            "id": meta["id"],
            "created": int(time.time()),
            "model": req.get("model") or self.args.served_model_name,
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


# --------------------------------------------------------------------------------------------
# HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, standin: Standin, kind: str):
        self.standin = standin
        self.kind = kind  # "api" or "bootstrap"
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-standin"
    sys_version = ""

    # quiet default logging; we log ourselves
    def log_message(self, fmt, *a):  # noqa: N802
        pass

    def _log_req(self, status: int) -> None:
        kind = self.server.kind  # type: ignore[attr-defined]
        tag = "" if kind == "api" else f" [{kind}]"
        log(f'{self.client_address[0]} - "{self.command} {self.path}" {status}{tag}')

    # ---- helpers

    @property
    def st(self) -> Standin:
        return self.server.standin  # type: ignore[attr-defined]

    def _read_body(self) -> bytes:
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            chunks = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _json_body(self) -> Dict[str, Any]:
        raw = self._read_body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(400, f"invalid JSON body: {e}")
        if not isinstance(body, dict):
            raise RequestError(400, "JSON body must be an object")
        return body

    def _send(self, status: int, body: Any = None, ctype: str = "application/json") -> None:
        if body is None:
            data = b""
        elif isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        elif isinstance(body, str):
            data = body.encode("utf-8")
        else:
            data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)
        self._log_req(status)

    def _send_error(self, e: RequestError) -> None:
        self._send(
            e.status,
            {"error": {"message": e.message, "type": e.err_type, "code": e.status}},
        )

    def _send_sse(self, events: List[Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for ev in events:
            self.wfile.write(b"data: " + json.dumps(ev).encode("utf-8") + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self._log_req(200)

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if len(path) > 1:
            path = path.rstrip("/")
        try:
            if self.server.kind == "bootstrap":  # type: ignore[attr-defined]
                self._bootstrap_route(method, path)
            else:
                self._api_route(method, path)
        except RequestError as e:
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # pragma: no cover - defensive
            log(f"ERROR handling {method} {path}: {e!r}\n{traceback.format_exc()}", err=True)
            try:
                self._send_error(RequestError(500, f"internal error: {e!r}", "InternalServerError"))
            except OSError:
                pass

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self):  # noqa: N802
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self):  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self):  # noqa: N802
        self._dispatch("DELETE")

    # ---- rank-0 API

    def _api_route(self, method: str, path: str) -> None:
        st = self.st
        if method == "GET" and path in ("/health", "/health_generate", "/ready"):
            reason = st.not_ready_reason()
            if reason is None:
                self._send(200)
            else:
                self._send(503, {"status": "unhealthy", "reason": reason})
            return
        if method == "GET" and path in ("/get_server_info", "/server_info"):
            self._send(200, st.server_info())
            return
        if method == "GET" and path in ("/get_model_info", "/model_info"):
            self._send(200, st.model_info())
            return
        if method == "GET" and path == "/v1/models":
            self._send(200, st.models_list())
            return
        if method == "GET" and path in ("/get_load", "/get_loads"):
            self._send(200, [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}])
            return
        if method == "GET" and path == "/metrics" and st.args.enable_metrics:
            self._send(200, st.metrics_text(), "text/plain; version=0.0.4")
            return
        if method in ("GET", "POST") and path == "/flush_cache":
            self._read_body()
            self._send(200, "Cache flushed.\n", "text/plain")
            return
        if method == "POST" and path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            body = self._json_body()
            reason = st.not_ready_reason()
            if reason is not None:
                raise RequestError(503, f"server not ready: {reason}", "ServiceUnavailableError")
            with st.lock:
                st.num_requests += 1
            if path == "/generate":
                res = st.generate(body)
                if body.get("stream"):
                    self._send_sse(res if isinstance(res, list) else [res])
                else:
                    self._send(200, res)
                return
            chat = path == "/v1/chat/completions"
            res = st.completions(body, chat=chat)
            if body.get("stream"):
                choice = res["choices"][0]
                if chat:
                    delta = {"role": "assistant", "content": choice["message"]["content"]}
                    ev = dict(res, object="chat.completion.chunk",
                              choices=[{"index": 0, "delta": delta, "finish_reason": "length"}])
                else:
                    ev = dict(res, choices=[choice])
                self._send_sse([ev])
            else:
                self._send(200, res)
            return
        self._send(404, {"detail": "Not Found"})

    # ---- bootstrap server (prefill rank 0)

    def _bootstrap_route(self, method: str, path: str) -> None:
        st = self.st
        if method == "GET" and path == "/health":
            self._send(200, "OK", "text/plain")
            return
        if method == "PUT" and path == "/route":
            body = self._json_body()
            try:
                node_rank = int(body.get("node_rank", body.get("engine_rank")))
            except (TypeError, ValueError):
                raise RequestError(400, "registration needs an integer node_rank")
            key = f"{body.get('role', 'Prefill')}:{node_rank}"
            body["node_rank"] = node_rank
            body["registered_at"] = time.time()
            with st.lock:
                st.registrations[key] = body
            log(
                f"bootstrap: registered prefill node rank {node_rank} "
                f"(rank_ip={body.get('rank_ip')}) from {self.client_address[0]}"
            )
            self._send(200, "OK", "text/plain")
            return
        if method == "GET" and path == "/route":
            with st.lock:
                regs = sorted(st.registrations.values(), key=lambda r: r.get("node_rank", 0))
            self._send(
                200,
                {
                    "prefill_info": {
                        "nnodes": st.nnodes,
                        "tp_size": st.args.tp_size,
                        "dp_size": st.args.dp_size,
                        "page_size": st.args.page_size,
                        "kv_cache_dtype": st.args.kv_cache_dtype,
                        "transfer_backend": st.args.disaggregation_transfer_backend,
                    },
                    "registrations": regs,
                },
            )
            return
        if method == "GET" and path.startswith("/kv/"):
            room = path[len("/kv/"):]
            if st.kv_fail_reason:
                raise RequestError(500, f"KV of room {room} unavailable: {st.kv_fail_reason}")
            entry = st.kv_get(room)
            if entry is None:
                self._send(404, {"error": {"message": f"no KV for room {room}", "code": 404}})
            else:
                self._send(200, entry)
            return
        self._send(404, {"detail": "Not Found"})


def _serve(st: Standin, host: str, port: int, kind: str) -> ThreadingHTTPServer:
    try:
        srv = _Server((host, port), Handler, st, kind)
    except OSError as e:
        _die(f"ERROR: cannot bind the {kind} HTTP server to {host}:{port}: {e}")
        raise  # unreachable
    t = threading.Thread(target=srv.serve_forever, name=f"{kind}-http", daemon=True)
    t.start()
    return srv


# --------------------------------------------------------------------------------------------
# multi-node group


def _set_keepalive(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, val in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)
    except OSError:
        pass


def _send_line(sock: socket.socket, obj: Dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode("utf-8") + b"\n")


def _recv_line(sock: socket.socket, limit: int = 65536) -> Optional[Dict[str, Any]]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > limit:
            return None
    try:
        return json.loads(buf.decode("utf-8"))
    except ValueError:
        return None


def _group_hello(st: Standin) -> Dict[str, Any]:
    a = st.args
    return {
        "node_rank": st.rank,
        "nnodes": st.nnodes,
        "disaggregation_mode": st.mode,
        "tp_size": a.tp_size,
        "model_path": a.model_path,
        "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
    }


class GroupLeader:
    """Rank 0 side of the simulated torch.distributed / NCCL group."""

    def __init__(self, st: Standin):
        self.st = st

    def listen(self) -> None:
        st = self.st
        host, port = st.args.dist_init_host, st.args.dist_init_port
        sock = None
        for bind_host in (host, "0.0.0.0"):
            s = None
            try:
                fam = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
                s = socket.socket(fam, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((bind_host, port))
                s.listen(64)
                sock = s
                log(f"dist-init: listening on {bind_host}:{port} for {st.nnodes - 1} peer rank(s)")
                break
            except OSError as e:
                if s is not None:
                    s.close()
                if e.errno == errno.EADDRINUSE:  # a real failure, not "not my address"
                    _die(f"ERROR: dist-init port {bind_host}:{port} is already in use: {e}")
                log(f"dist-init: cannot bind {bind_host}:{port} ({e}); trying 0.0.0.0")
        if sock is None:
            _die(f"ERROR: cannot listen on dist-init address {host}:{port}")
        st.group_listener = sock
        threading.Thread(target=self._accept_loop, args=(sock,), name="group-accept", daemon=True).start()

    def _accept_loop(self, sock: socket.socket) -> None:
        while not self.st.shutdown.is_set():
            try:
                conn, addr = sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._handle_peer, args=(conn, addr), name="group-peer", daemon=True
            ).start()

    def _reject(self, conn: socket.socket, reason: str) -> None:
        try:
            _send_line(conn, {"ok": False, "reason": reason})
        except OSError:
            pass
        conn.close()

    def _handle_peer(self, conn: socket.socket, addr) -> None:
        st = self.st
        _set_keepalive(conn)
        conn.settimeout(30)
        try:
            hello = _recv_line(conn)
        except OSError:
            hello = None
        if not hello or "node_rank" not in hello:
            conn.close()
            return
        conn.settimeout(None)
        r = hello.get("node_rank")
        mine = _group_hello(st)
        for key in ("nnodes", "disaggregation_mode", "tp_size", "model_path",
                    "disaggregation_bootstrap_port"):
            if hello.get(key) != mine.get(key):
                reason = (f"node rank {r} has {key}={hello.get(key)!r} but rank 0 has "
                          f"{key}={mine.get(key)!r}; every rank must get the same arguments")
                log(f"dist-init: rejecting {addr[0]}: {reason}", err=True)
                self._reject(conn, reason)
                return
        if not isinstance(r, int) or not 1 <= r < st.nnodes:
            self._reject(conn, f"invalid node rank {r!r} for nnodes={st.nnodes}")
            return
        with st.lock:
            if st.broken:
                reason = f"group is broken ({st.broken}); restart every rank of the group"
            elif r in st.peers:
                reason = f"node rank {r} is already connected"
            elif r in st.joined_once:
                reason = f"node rank {r} already joined once; restart every rank of the group"
            else:
                reason = None
                st.peers[r] = conn
                st.joined_once.add(r)
                n = len(st.peers)
        if reason:
            log(f"dist-init: rejecting node rank {r} from {addr[0]}: {reason}", err=True)
            self._reject(conn, reason)
            return
        try:
            _send_line(conn, {"ok": True})
        except OSError:
            pass
        log(f"dist-init: node rank {r} joined from {addr[0]} ({n}/{st.nnodes - 1} peers)")
        if n == st.nnodes - 1:
            log(f"dist-init: all {st.nnodes} node ranks joined the group")
        # hold the connection; EOF / error = lost peer
        while True:
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
        if st.shutdown.is_set():
            return
        self._break(f"lost connection to node rank {r}")

    def _break(self, reason: str) -> None:
        st = self.st
        with st.lock:
            if st.broken:
                return
            st.broken = reason
            peers = list(st.peers.items())
            st.peers.clear()
        log(
            f"ERROR: {reason}: the group is broken (like an NCCL communicator abort); "
            "/health is 503 from now on; restart every rank of this group",
            err=True,
        )
        if st.watchdog_seconds > 0:
            timer = threading.Timer(st.watchdog_seconds, _die, args=(
                f"watchdog timeout ({st.watchdog_seconds:g}s) after: {reason}; exiting",))
            timer.daemon = True
            timer.start()
        for r, c in peers:
            try:
                _send_line(c, {"abort": reason})
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                c.close()
            except OSError:
                pass


class GroupMember:
    """Rank >= 1 side: connect to rank 0, hold the connection, die when it drops."""

    def __init__(self, st: Standin):
        self.st = st
        self.sock: Optional[socket.socket] = None

    def connect(self) -> None:
        st = self.st
        host, port = st.args.dist_init_host, st.args.dist_init_port
        deadline = time.monotonic() + st.dist_timeout
        last_print = 0.0
        attempt = 0
        while True:
            attempt += 1
            try:
                s = socket.create_connection((host, port), timeout=5)
                _set_keepalive(s)
                _send_line(s, _group_hello(st))
                reply = _recv_line(s)
                if reply is None:
                    raise OSError("connection closed during handshake")
                if not reply.get("ok"):
                    _die(f"ERROR: rank 0 at {host}:{port} rejected node rank {st.rank}: "
                         f"{reply.get('reason')}")
                s.settimeout(None)
                self.sock = s
                log(f"dist-init: joined the group at {host}:{port} as node rank {st.rank} "
                    f"(after {attempt} attempt(s))")
                break
            except OSError as e:
                now = time.monotonic()
                if now >= deadline:
                    _die(f"ERROR: timed out after {st.dist_timeout:.0f}s connecting to "
                         f"--dist-init-addr {host}:{port}: {e}")
                if now - last_print >= 10 or attempt == 1:
                    log(f"dist-init: waiting for rank 0 at {host}:{port} ({e}); retrying")
                    last_print = now
                if st.shutdown.wait(0.5):
                    return
        threading.Thread(target=self._hold, name="group-hold", daemon=True).start()

    def local_ip(self) -> str:
        ip = os.environ.get("SGLANG_HOST_IP") or os.environ.get("HOST_IP")
        if ip:
            return ip
        try:
            return self.sock.getsockname()[0] if self.sock else "127.0.0.1"
        except OSError:
            return "127.0.0.1"

    def _hold(self) -> None:
        st = self.st
        buf = b""
        reason = "connection to node rank 0 closed"
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError as e:
                reason = f"connection to node rank 0 failed: {e}"
                data = b""
            if not data:
                break
            buf += data
            if b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                try:
                    msg = json.loads(line.decode("utf-8"))
                except ValueError:
                    msg = {}
                if "abort" in msg:
                    reason = f"rank 0 aborted the group: {msg['abort']}"
        if st.shutdown.is_set():
            return
        _die(
            f"ERROR: torch.distributed.DistBackendError: NCCL communicator was aborted on node "
            f"rank {st.rank} ({reason}; stand-in). Exiting."
        )


# --------------------------------------------------------------------------------------------
# lifecycle


def _load_model(st: Standin) -> None:
    a = st.args
    log(
        f"loading model {a.model_path} (tp_size={a.tp_size}, ep_size={a.ep_size}, "
        f"nnodes={a.nnodes}, node_rank={a.node_rank}, "
        f"load {st.load_seconds:.1f}s simulated) ..."
    )
    if st.exit_while_loading:
        st.shutdown.wait(st.load_seconds / 2)
        msg = (
            "Traceback (most recent call last):\n"
            '  File "sglang/srt/model_executor/model_runner.py", line 1, in load_model\n'
            f"RuntimeError: CUDA out of memory (stand-in fault injection: "
            f"SGLANG_STANDIN_EXIT_WHILE_LOADING={os.environ.get('SGLANG_STANDIN_EXIT_WHILE_LOADING')}, "
            f"node rank {st.rank})"
        )
        _die(msg, 1)
    st.shutdown.wait(st.load_seconds)
    log(f"Load weight end. node rank {st.rank}: model {a.model_path} loaded (stand-in)")
    st.loaded.set()


def _register_with_bootstrap(st: Standin, member: GroupMember) -> None:
    a = st.args
    url = f"http://{_url_host(a.dist_init_host)}:{a.disaggregation_bootstrap_port}/route"
    body = json.dumps(
        {
            "role": "Prefill",
            "node_rank": st.rank,
            "engine_rank": st.rank,
            "tp_size": a.tp_size,
            "nnodes": st.nnodes,
            "rank_ip": member.local_ip(),
            "rank_port": a.dist_init_port,
        }
    ).encode("utf-8")
    deadline = time.monotonic() + st.bootstrap_timeout
    last_err = ""
    while True:
        req = urllib.request.Request(
            url, data=body, method="PUT", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                resp.read()
            log(f"bootstrap: registered node rank {st.rank} with {url}")
            return
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            last_err = str(e)
        if time.monotonic() >= deadline:
            _die(
                f"ERROR: Failed to register node rank {st.rank} with the prefill bootstrap server "
                f"{url} within {st.bootstrap_timeout:.0f}s: {last_err} (the bootstrap server runs "
                "on rank 0, binds --host, and every rank needs the same "
                "--disaggregation-bootstrap-port)"
            )
        if st.shutdown.wait(0.5):
            return


def _install_signal_handlers(st: Standin) -> None:
    def _handler(signum, _frame):
        name = signal.Signals(signum).name
        st.shutdown.set()
        log(f"Received {name}, shutting down node rank {st.rank} (stand-in)")
        os._exit(0)

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)


def run(args) -> int:
    global _LOG_PREFIX
    _LOG_PREFIX = f"standin {args.disaggregation_mode} node_rank={args.node_rank}/{args.nnodes}"
    st = Standin(args)
    _install_signal_handlers(st)
    a = args
    log(f"sglang stand-in {__version__} (python {sys.version.split()[0]}); server_args="
        + json.dumps({k: v for k, v in vars(a).items()}, default=str))
    if st.kv_fail_reason:
        log(f"WARNING: KV transfer will fail: {st.kv_fail_reason}", err=True)

    if st.rank == 0:
        log(f"Starting HTTP server on {a.host}:{a.port} (health is 503 until ready)")
        st.http_server = _serve(st, a.host, a.port, "api")
        if st.mode == "prefill":
            log(f"Starting bootstrap server on {a.host}:{a.disaggregation_bootstrap_port}")
            st.bootstrap_server = _serve(st, a.host, a.disaggregation_bootstrap_port, "bootstrap")
            st.registrations["Prefill:0"] = {
                "role": "Prefill", "node_rank": 0, "engine_rank": 0, "rank_ip": a.host,
                "registered_at": time.time(),
            }
        if st.nnodes > 1:
            GroupLeader(st).listen()
            last = 0.0
            while not st.all_peers_joined() and not st.broken:
                if time.monotonic() - last >= 10:
                    log(f"dist-init: {st.not_ready_reason()}")
                    last = time.monotonic()
                st.shutdown.wait(0.1)
        if not st.broken:
            _load_model(st)
        last = 0.0
        while not st.broken and not st.all_prefill_registered():
            if time.monotonic() - last >= 10:
                log(st.not_ready_reason() or "")
                last = time.monotonic()
            st.shutdown.wait(0.1)
        if st.broken:
            log(f"NOT ready: {st.broken} (health stays 503)", err=True)
        else:
            st.ready_since = time.time()
            log(f"{READY_BANNER} (stand-in: node rank 0 of {st.nnodes}, "
                f"{st.mode} mode, http://{_url_host(a.host)}:{a.port})")
            st.announced.set()
    else:
        member = GroupMember(st)
        member.connect()
        _load_model(st)
        if st.mode == "prefill":
            _register_with_bootstrap(st, member)
        log(f"node rank {st.rank} ready (no HTTP server on node rank >= 1; rank 0 serves HTTP)")

    while not st.shutdown.wait(1.0):
        pass
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    sys.exit(run(args))


if __name__ == "__main__":
    main()
