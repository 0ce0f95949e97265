"""The simulated torch.distributed / NCCL group of a multi-node server.

Rank 0 listens on --dist-init-addr; ranks >= 1 connect, send a hello with the arguments every
rank must share, and hold the connection. A lost connection is a lost peer and breaks the group
for good, as an aborted NCCL communicator does: rank 0 turns unhealthy (and exits when its
watchdog fires), ranks >= 1 exit non-zero.

A peer that is there but does not take part (its process stopped or frozen: `docker pause`, a
rank stuck in a collective) hangs the group instead: rank 0 sends every rank a step a few times a
second, and once one has answered none for SGLANG_STANDIN_STEP_TIMEOUT_SECONDS the whole
group's forward stalls. Requests in flight make no progress, rank 0's /health answers 503 after
SGLANG_HEALTH_CHECK_TIMEOUT seconds without output, as SGLang 0.5.19's health_generate does
(srt/entrypoints/http_server.py), ranks >= 1 keep their dummy health server's 200, and once work
has made no progress for --watchdog-timeout seconds rank 0 exits non-zero, as SGLang's watchdog
does (srt/utils/watchdog.py, WatchdogRaw). A peer that answers again lets the forward go on.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from typing import Any, Dict, Optional

from .log import die, log
from .state import Standin


def _set_keepalive(sock: socket.socket) -> None:
    # A node that vanishes sends no FIN: keepalive notices it within ~25 s, not hours.
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
        # node rank -> when it last answered a step (or joined)
        self.seen: Dict[int, float] = {}

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
                    die(f"ERROR: dist-init port {bind_host}:{port} is already in use: {e}")
                log(f"dist-init: cannot bind {bind_host}:{port} ({e}); trying 0.0.0.0")
        if sock is None:
            die(f"ERROR: cannot listen on dist-init address {host}:{port}")
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
        with st.lock:
            self.seen[r] = time.monotonic()
        log(f"dist-init: node rank {r} joined from {addr[0]} ({n}/{st.nnodes - 1} peers)")
        if n == st.nnodes - 1:
            log(f"dist-init: all {st.nnodes} node ranks joined the group")
            threading.Thread(target=self._step_loop, name="group-steps", daemon=True).start()
        # hold the connection; EOF / error = lost peer; anything else is an answered step
        while True:
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
            with st.lock:
                self.seen[r] = time.monotonic()
        if st.shutdown.is_set():
            return
        self._break(f"lost connection to node rank {r}")

    def _step_loop(self) -> None:
        """The group's collectives, simulated: a step to every peer a few times a second; a peer
        late past the step timeout stalls the forward until it answers again."""
        st = self.st
        interval = min(0.5, st.step_timeout / 4)
        step = 0
        active_since: Optional[float] = None
        while not st.shutdown.wait(interval):
            step += 1
            with st.lock:
                if st.broken:
                    return
                peers = dict(st.peers)
                seen = dict(self.seen)
                active = st.num_running_reqs > 0 or st.health_waiting > 0
            for conn in peers.values():
                try:  # a frozen peer reads nothing: never block on its full buffer
                    conn.send(json.dumps({"step": step}).encode("utf-8") + b"\n",
                              socket.MSG_DONTWAIT)
                except OSError:
                    pass
            now = time.monotonic()
            late = sorted(r for r in peers if now - seen.get(r, now) > st.step_timeout)
            if late and st.stalled_since is None:
                st.stall_reason = (f"node rank(s) {late} answered no step for "
                                   f"{st.step_timeout:g}s")
                st.stalled_since = now
                st.flowing.clear()
                log(f"ERROR: the group's forward is stalled: {st.stall_reason} (a rank that "
                    f"stopped taking part); requests in flight make no progress, /health "
                    f"answers 503 after {st.health_check_timeout:g}s without output, and work "
                    f"without progress for {st.watchdog_timeout:g}s ends this server", err=True)
            elif not late and st.stalled_since is not None:
                log(f"the group's forward goes on after {now - st.stalled_since:.1f}s stalled")
                st.stalled_since = None
                st.stall_reason = None
                active_since = None
                st.flowing.set()
            if st.stalled_since is None:
                continue
            if active and active_since is None:
                active_since = now
            if active_since is not None and now - active_since > st.watchdog_timeout:
                die(f"watchdog timeout (--watchdog-timeout {st.watchdog_timeout:g}s): the "
                    f"forward made no progress ({st.stall_reason}); exiting")

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
            timer = threading.Timer(st.watchdog_seconds, die, args=(
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
                    die(f"ERROR: rank 0 at {host}:{port} rejected node rank {st.rank}: "
                         f"{reply.get('reason')}")
                s.settimeout(None)
                self.sock = s
                log(f"dist-init: joined the group at {host}:{port} as node rank {st.rank} "
                    f"(after {attempt} attempt(s))")
                break
            except OSError as e:
                now = time.monotonic()
                if now >= deadline:
                    die(f"ERROR: timed out after {st.dist_timeout:.0f}s connecting to "
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
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                try:
                    msg = json.loads(line.decode("utf-8"))
                except ValueError:
                    msg = {}
                if "abort" in msg:
                    reason = f"rank 0 aborted the group: {msg['abort']}"
                elif "step" in msg:
                    # This rank takes part in the step (a frozen process answers nothing).
                    try:
                        _send_line(self.sock, {"step_done": msg["step"]})
                    except OSError:
                        pass
        if st.shutdown.is_set():
            return
        die(
            f"ERROR: torch.distributed.DistBackendError: NCCL communicator was aborted on node "
            f"rank {st.rank} ({reason}; stand-in). Exiting."
        )
