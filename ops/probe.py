"""HTTP probes from the operator's machine, or with `curl` on the node over SSH when the node's
port cannot be reached from here. Every answer says which path it took (`via`)."""

from __future__ import annotations

import json
import re
import shlex
import ssl
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from components.render import router_auth_header_file

from .remote import RemoteError, Transport, run_patiently

VIA_CHOICES = ("auto", "direct", "ssh")


# Enough for the rust router's GET /workers of a large cluster; bodies stay out of as_json.
BODY_LIMIT = 65536


@dataclass
class HttpAnswer:
    url: str
    via: str  # "direct" | "ssh"
    status: int | None = None  # None: no HTTP answer at all
    seconds: float | None = None
    error: str | None = None
    body: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    def summary(self) -> str:
        if self.status is not None:
            return str(self.status)
        return self.error or "no answer"

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("body")
        if self.seconds is not None:
            data["seconds"] = round(self.seconds, 4)
        return data


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, 5.0))


@dataclass(frozen=True)
class Tls:
    """How an https:// URL (the door with TLS) is checked from here: CONTEXT, and what it checks
    the certificate against, in words."""

    context: ssl.SSLContext
    verification: str

    @property
    def verified(self) -> bool:
        return self.context.verify_mode != ssl.CERT_NONE


def tls_check(ca_certificate: str | None, certificate: str | None) -> Tls:
    """The door's certificate checked against its CA (router.door.tls.caCertificate), else
    against the system's trust store plus the certificate itself (a self-signed one), else not
    at all (the config is not at hand: the CA is not among the outputs)."""
    if ca_certificate:
        return Tls(ssl.create_default_context(cadata=ca_certificate),
                   "verified against router.door.tls.caCertificate")
    if certificate:
        context = ssl.create_default_context()
        context.load_verify_locations(cadata=certificate)
        return Tls(context, "verified against the system's trust store and "
                            "router.door.tls.certificate")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return Tls(context, "not verified (router.door.tls is not in the config at hand)")


def direct_client(timeout: float, verify: ssl.SSLContext | bool = True) -> httpx.Client:
    # trust_env=False: cluster addresses never go through the caller's HTTP(S)_PROXY.
    return httpx.Client(timeout=_timeout(timeout), trust_env=False, verify=verify,
                        limits=httpx.Limits(max_connections=64))


# What makes a node's port "not reachable from here": no TCP connection at all. A connection
# that opens and then hangs reached the server, and asking again over SSH would only wait twice.
_UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout)


def _tls_refused(error: Exception) -> bool:
    """A TLS handshake that failed (httpx says ConnectError): a connection was made."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return True
        cause = cause.__cause__ or cause.__context__
    return "[SSL:" in str(error)


def _error(error: Exception) -> str:
    text = str(error) or type(error).__name__
    match = re.search(r"\[Errno \d+\] ([^\]')]+)", text)
    if match:
        return match.group(1).strip().lower()
    if isinstance(error, httpx.TimeoutException):
        return "timed out"
    return text[:120]


def settled(future: Future | None, fallback: Any) -> Any:
    """A probe's answer once it has one; FALLBACK for a probe never submitted or still running
    when the status stopped waiting (its pool is shut down without waiting for it)."""
    return future.result() if future is not None and future.done() else fallback


class Prober:
    """TLS: how https:// URLs are checked (None: against the system's trust store). Over SSH,
    curl on the node does not verify an https:// URL (-k): it talks to its own node."""

    def __init__(self, transport: Transport | None, timeout: float, via: str = "auto",
                 tls: Tls | None = None) -> None:
        if via not in VIA_CHOICES:
            raise ValueError(f"via must be one of {VIA_CHOICES}")
        self.transport = transport
        self.timeout = timeout
        self.via = via
        self.tls = tls
        # One client for every probe (it is thread-safe): building one costs more than a probe.
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = (direct_client(self.timeout) if self.tls is None
                                else direct_client(self.timeout, self.tls.context))
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def get(self, url: str, node: str) -> HttpAnswer:
        return self.request("GET", url, node)

    def request(self, method: str, url: str, node: str, body: Any = None,
                timeout: float | None = None, api_key: str | None = None,
                router_port: int | None = None) -> HttpAnswer:
        """API_KEY: the rust router's; over SSH, curl reads it from its file on the router's
        node, so it is on no command line. ROUTER_PORT: router.port, whose directory holds that
        file (default: URL's port; a door's slot has a port of its own)."""
        timeout = timeout or self.timeout
        if self.via in ("auto", "direct"):
            answer, reachable = self._direct(method, url, body, timeout, api_key)
            if reachable or self.via == "direct" or self.transport is None:
                return answer
        header_file = (router_auth_header_file(router_port or urlsplit(url).port or 80)
                       if api_key else None)
        return self._over_ssh(method, url, node, body, timeout, header_file)

    def _direct(self, method: str, url: str, body: Any, timeout: float,
                api_key: str | None = None) -> tuple[HttpAnswer, bool]:
        client = self._http()
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        try:
            response = client.request(method, url, json=body, headers=headers,
                                      timeout=_timeout(timeout))
            return HttpAnswer(url, "direct", response.status_code, time.monotonic() - started,
                              body=response.text[:BODY_LIMIT]), True
        except _UNREACHABLE as error:
            if _tls_refused(error):
                # The port answered, its certificate was refused: asking again over SSH (curl
                # -k) would only hide that.
                return HttpAnswer(url, "direct", seconds=time.monotonic() - started,
                                  error=_error(error)), True
            return HttpAnswer(url, "direct", error=_error(error)), False
        except httpx.HTTPError as error:
            return HttpAnswer(url, "direct", seconds=time.monotonic() - started,
                              error=_error(error)), True

    def _over_ssh(self, method: str, url: str, node: str, body: Any,
                  timeout: float, header_file: str | None = None) -> HttpAnswer:
        # An https:// URL (the door with TLS) is asked on its own node, unverified.
        command = curl_command(method, url, timeout, with_body=body is not None,
                               header_file=header_file, insecure=url.startswith("https://"))
        stdin = json.dumps(body).encode() if body is not None else None
        if self.transport is None:
            return HttpAnswer(url, "ssh", error="no SSH transport to the node")
        try:
            # The SSH connection's own time is not the probe's: allow for it on top. curl's
            # --max-time bounds the answer, so a GET whose SSH command timed out met a slow
            # node, not a slow server: asked once more, patiently, like every read-only probe.
            if body is None and method == "GET":
                result = run_patiently(self.transport, node, command, timeout + 5)
            else:
                result = self.transport.run(node, command, timeout=timeout + 5, stdin=stdin)
        except RemoteError as error:
            return HttpAnswer(url, "ssh", error=str(error))
        return parse_curl(url, result.out, result.err, result.status)


STATUS_MARK = "KIMIPD-HTTP"


def curl_command(method: str, url: str, timeout: float, with_body: bool = False,
                 stream: bool = False, header_file: str | None = None,
                 insecure: bool = False, ca_file: str | None = None) -> str:
    """curl on the node: the body on stdout, then a last line `KIMIPD-HTTP <code> <seconds>`.
    INSECURE: an https:// URL's certificate is not verified (-k); CA_FILE: verified against
    that file on the node (the door's ca.pem)."""
    argv = ["curl", "-sS", "--noproxy", "*", "--max-time", f"{timeout:g}", "-X", method,
            "-w", f"\\n{STATUS_MARK} %{{http_code}} %{{time_total}}\\n"]
    if insecure:
        argv.append("--insecure")
    elif ca_file is not None:
        argv += ["--cacert", ca_file]
    if stream:
        argv.append("-N")
    if with_body:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    if header_file is not None:
        argv += ["-H", f"@{header_file}"]  # the rust router's key, read on the node
    return shlex.join(argv + [url])


def parse_curl(url: str, stdout: str, stderr: str, exit_status: int) -> HttpAnswer:
    body, _, tail = stdout.rpartition(f"\n{STATUS_MARK} ")
    fields = tail.split()
    code = int(fields[0]) if fields and fields[0].isdigit() else 0
    seconds = float(fields[1]) if len(fields) > 1 else None
    if code == 0:
        error = stderr.strip().removeprefix("curl: ") or f"curl exited {exit_status}"
        if exit_status == 127:
            error = "curl is not installed on the node"
        return HttpAnswer(url, "ssh", error=_curl_error(error))
    return HttpAnswer(url, "ssh", code, seconds, body=body[:BODY_LIMIT])


def _curl_error(text: str) -> str:
    # "(7) Failed to connect to 10.0.0.1 port 30000 after 0 ms: Couldn't connect to server"
    text = re.sub(r"^\(\d+\)\s*", "", text.splitlines()[0] if text else text)
    if "Connection refused" in text or "Couldn't connect" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    return text[:120]
