"""The HTTP server on --host:--port: rank 0's full API, the dummy health server of ranks >= 1."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

from .auth import ADMIN_OPTIONAL_ROUTES, Decision
from .generation import completions, generate, generate_stream
from .http_base import Handler, RequestError
from .metrics import exposition

# A few of SGLang's admin routes, so that a probe (are they behind the admin key?) meets real
# routes. Each only answers as SGLang does on success (body, content type); nothing is loaded,
# paused, aborted, released or profiled. Their methods are SGLang's (auth.ADMIN_OPTIONAL_ROUTES).
ADMIN_ACKS: Dict[str, Tuple[Any, str]] = {
    "/update_weights_from_disk": (
        {"success": True, "message": "Succeeded to update model weights.",
         "num_paused_requests": 0}, "application/json"),
    "/pause_generation": (
        {"message": "Generation paused successfully.", "status": "ok"}, "application/json"),
    "/continue_generation": (
        {"message": "Generation continued successfully.", "status": "ok"}, "application/json"),
    "/abort_request": (None, "application/json"),
    "/release_memory_occupation": ("null", "application/json"),
    "/resume_memory_occupation": ("null", "application/json"),
    "/load_lora_adapter": (
        {"success": True, "error_message": None, "loaded_adapters": {}}, "application/json"),
    "/start_profile": ("Start profiling.\n", "text/plain; charset=utf-8"),
    "/stop_profile": ("Stop profiling. This will take some time.\n", "text/plain; charset=utf-8"),
}
# Written inside a running rank 0's container by a test (docker exec): seconds its /health
# answers late while requests run, as a busy SGLang's does (Standin.busy_health_seconds).
BUSY_HEALTH_FILE = "/tmp/sglang-standin-busy-health-seconds"
_ADMIN_ACK_METHODS = {path: methods for path, methods in ADMIN_OPTIONAL_ROUTES if path in ADMIN_ACKS}


class ApiHandler(Handler):
    """Rank 0: SGLang's HTTP API; /health is 503 until the whole group is ready."""

    kind = "api"

    def refusal(self, method: str, path: str) -> Optional[Decision]:
        decision = self.st.api_keys.check(method, path, self.headers.get("Authorization"))
        return None if decision.allowed else decision

    def _stalled_health(self) -> Optional[str]:
        """SGLang 0.5.19's /health on a hung group: its one-token generate waits up to
        SGLANG_HEALTH_CHECK_TIMEOUT for any output, then 503 (srt/entrypoints/http_server.py,
        health_generate); the waiting check is work the watchdog sees. None if the forward goes
        on meanwhile."""
        st = self.st
        with st.lock:
            st.health_waiting += 1
        try:
            if st.flowing.wait(st.health_check_timeout):
                return None
        finally:
            with st.lock:
                st.health_waiting -= 1
        return (f"no output for {st.health_check_timeout:g}s (SGLANG_HEALTH_CHECK_TIMEOUT): the "
                f"forward is stalled: {st.stall_reason}")

    def _busy_delay(self) -> None:
        """SGLang's /health on a busy rank 0 answers once its scheduler gives its next output:
        late, while requests run (SGLANG_STANDIN_BUSY_HEALTH_SECONDS or BUSY_HEALTH_FILE)."""
        st = self.st
        seconds = st.busy_health_seconds
        try:
            with open(BUSY_HEALTH_FILE, encoding="utf-8") as stream:
                seconds = max(0.0, float(stream.read().strip() or 0))
        except (OSError, ValueError):
            pass
        with st.lock:
            running = st.num_running_reqs
        if seconds > 0 and running > 0:
            time.sleep(seconds)

    def route(self, method: str, path: str) -> None:
        st = self.st
        if method == "GET" and path in ("/health", "/health_generate", "/ready"):
            reason = st.not_ready_reason()
            if reason is None and not st.flowing.is_set():
                reason = self._stalled_health()
            if reason is None and path != "/ready":
                self._busy_delay()
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
            # What a drain polls: the requests this server is still working on.
            with st.lock:
                running = st.num_running_reqs
            self._send(200, [{"dp_rank": 0, "num_reqs": running, "num_waiting_reqs": 0,
                              "num_tokens": 0}])
            return
        if method == "GET" and path == "/metrics" and st.args.enable_metrics:
            self._send(200, *exposition(st.api_metrics, self.headers.get("Accept")))
            return
        if method in ("GET", "POST") and path == "/flush_cache":
            self._read_body()
            self._send(200, "Cache flushed.\n", "text/plain")
            return
        if path in ADMIN_ACKS:
            self._read_body()
            if method not in _ADMIN_ACK_METHODS[path]:
                self._send(405, {"detail": "Method Not Allowed"})
                return
            self._send(200, *ADMIN_ACKS[path])
            return
        if method == "POST" and path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            arrived = time.monotonic()  # time to first token counts from here
            body = self._json_body()
            reason = st.not_ready_reason()
            if reason is not None:
                raise RequestError(503, f"server not ready: {reason}", "ServiceUnavailableError")
            with st.lock:
                st.num_requests += 1
            if path == "/generate":
                if body.get("stream"):
                    events = generate_stream(st, body, arrived)
                    try:
                        self._send_sse(events)
                    finally:
                        events.close()
                else:
                    self._send(200, generate(st, body, arrived))
                return
            chat = path == "/v1/chat/completions"
            res = completions(st, body, chat=chat, arrived=arrived)
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


DUMMY_HEALTH_PATHS = ("/health", "/health_generate", "/ping")


class DummyHealthHandler(Handler):
    """Ranks >= 1 once loaded: SGLang 0.5.19's `launch_dummy_health_check_server` (engine.py).

    Its three GET routes answer 200 with no body whatever the group's state; FastAPI answers 405
    to another method on them and 404 elsewhere. With --enable-metrics SGLang also mounts
    /metrics there (the Prometheus multiprocess registry of that node's schedulers): the
    scheduler gauges with this node's first scheduler's labels, at 0 (no traffic reaches it).
    """

    kind = "health"

    def route(self, method: str, path: str) -> None:
        if path in DUMMY_HEALTH_PATHS:
            if method == "GET":
                self._send(200)
            else:
                self._send(405, {"detail": "Method Not Allowed"})
            return
        if method == "GET" and path == "/metrics" and self.st.args.enable_metrics:
            self._send(200, *exposition(self.st.dummy_health_metrics, self.headers.get("Accept")))
            return
        self._send(404, {"detail": "Not Found"})
