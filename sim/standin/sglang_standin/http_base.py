"""HTTP plumbing shared by the stand-in's servers: request bodies, JSON and SSE replies, errors."""

from __future__ import annotations

import json
import socket
import threading
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Type

from .log import log

if TYPE_CHECKING:
    from .auth import Decision
    from .state import Standin


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body with this status."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


def url_host(host: str) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, standin: "Standin"):
        self.standin = standin
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)


class Handler(BaseHTTPRequestHandler):
    """One request; a subclass answers it in `route` and names its server in `kind`."""

    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on every accepted socket, as SGLang's uvicorn (asyncio) sets it: with Nagle a
    # body written after its headers waits for the client's delayed ACK, ~40 ms a request.
    disable_nagle_algorithm = True
    server_version = "sglang-standin"
    sys_version = ""
    kind = "api"

    def route(self, method: str, path: str) -> None:
        raise NotImplementedError

    def refusal(self, method: str, path: str) -> Optional["Decision"]:
        """What this server refuses before routing; by default nothing (no API keys)."""
        return None

    # The stand-in logs each request itself, with its status, through log().
    def log_message(self, fmt, *a):  # noqa: N802
        pass

    def _log_req(self, status: int) -> None:
        tag = "" if self.kind == "api" else f" [{self.kind}]"
        log(f'{self.client_address[0]} - "{self.command} {self.path}" {status}{tag}')

    @property
    def st(self) -> "Standin":
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

    def _send_sse(self, events: Iterable[Any]) -> None:
        """`data: {json}` per event as it comes (a generator paces them), then `data: [DONE]`."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        # One small write per token: without this, Nagle holds a token back until the previous
        # one is acknowledged, and the client would see tokens in bursts.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
            # The real method (HEAD is not GET here) and the decoded path, as SGLang's middleware
            # sees them, before any routing.
            refused = self.refusal(self.command, urllib.parse.unquote(self.path.split("?", 1)[0]))
            if refused is not None:
                self._read_body()
                self._send(refused.status, refused.body())
                return
            self.route(method, path)
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

    def do_OPTIONS(self):  # noqa: N802
        self._dispatch("OPTIONS")


def serve(st: "Standin", host: str, port: int, handler: Type[Handler]) -> ThreadingHTTPServer:
    """Bind host:port and serve on a daemon thread; raises OSError when the bind fails."""
    srv = _Server((host, port), handler, st)
    threading.Thread(target=srv.serve_forever, name=f"{handler.kind}-http", daemon=True).start()
    return srv
