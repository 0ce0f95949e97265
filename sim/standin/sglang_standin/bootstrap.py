"""Prefill KV bootstrap: rank 0's bootstrap server and KV store, and its two clients.

Prefill ranks >= 1 register with it (`PUT /route`); decode fetches each request's "KV" from it
(`GET /kv/<room>`), as Mooncake moves the KV cache from prefill to decode in the real deployment.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from .http_base import Handler, RequestError, url_host
from .log import die, log

if TYPE_CHECKING:
    from .state import Standin

# Nothing deletes a room once decode has read it: the bound keeps memory flat under long load.
KV_STORE_CAPACITY = 10000
# How long GET /kv/<room> may hold a request (the client asks for up to this with `?wait=`):
# for a room prefill has not received yet, or one whose prefill is still computing (then it
# answers 202 and decode asks again at once). Decode gets the KV when prefill has it, not a poll
# interval later.
KV_LONG_POLL_SECONDS = 1.0


class KVStore:
    """What prefill "sent" for each bootstrap room, oldest dropped first.

    A room exists from the moment prefill receives its request; its KV is ready once prefill has
    computed it (at once, or after the simulated prefill time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rooms: "OrderedDict[str, Tuple[Dict[str, Any], threading.Event]]" = OrderedDict()

    def put(self, room: Any, entry: Dict[str, Any], ready: bool = True) -> None:
        done = threading.Event()
        if ready:
            done.set()
        with self._changed:
            self._rooms[str(room)] = (entry, done)
            self._rooms.move_to_end(str(room))
            while len(self._rooms) > KV_STORE_CAPACITY:
                self._rooms.popitem(last=False)
            self._changed.notify_all()

    def mark_ready(self, room: Any) -> None:
        with self._lock:
            held = self._rooms.get(str(room))
        if held is not None:
            held[1].set()

    def get(self, room: str, wait: float = 0.0) -> Tuple[Optional[Dict[str, Any]], bool]:
        """(entry or None, ready), waiting up to `wait` seconds for the room to appear and its
        prefill to finish."""
        deadline = time.monotonic() + wait
        with self._changed:
            while room not in self._rooms and time.monotonic() < deadline:
                self._changed.wait(deadline - time.monotonic())
            held = self._rooms.get(room)
        if held is None:
            return None, False
        entry, done = held
        done.wait(max(0.0, deadline - time.monotonic()))
        return entry, done.is_set()


def _requested_wait(raw_path: str) -> float:
    """`?wait=SECONDS` (capped at KV_LONG_POLL_SECONDS); none: answer at once."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(raw_path).query)
    try:
        return max(0.0, min(float(query.get("wait", ["0"])[0]), KV_LONG_POLL_SECONDS))
    except ValueError:
        return 0.0


class BootstrapHandler(Handler):
    """The bootstrap server of prefill rank 0, on --host:--disaggregation-bootstrap-port."""

    kind = "bootstrap"

    def route(self, method: str, path: str) -> None:
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
            entry, ready = st.kv.get(room, wait=_requested_wait(self.path))
            if entry is None:
                self._send(404, {"error": {"message": f"no KV for room {room}", "code": 404}})
            elif not ready:
                self._send(202, {"status": "prefilling", "bootstrap_room": room})
            else:
                self._send(200, entry)
            return
        self._send(404, {"detail": "Not Found"})


def register_with_bootstrap(st: "Standin", rank_ip: str) -> None:
    """Prefill rank >= 1, once loaded: PUT /route on rank 0's bootstrap server, or exit 1."""
    a = st.args
    url = f"http://{url_host(a.dist_init_host)}:{a.disaggregation_bootstrap_port}/route"
    body = json.dumps(
        {
            "role": "Prefill",
            "node_rank": st.rank,
            "engine_rank": st.rank,
            "tp_size": a.tp_size,
            "nnodes": st.nnodes,
            "rank_ip": rank_ip,
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
            die(
                f"ERROR: Failed to register node rank {st.rank} with the prefill bootstrap server "
                f"{url} within {st.bootstrap_timeout:.0f}s: {last_err} (the bootstrap server runs "
                "on rank 0, binds --host, and every rank needs the same "
                "--disaggregation-bootstrap-port)"
            )
        if st.shutdown.wait(0.5):
            return


def fetch_kv(host: str, port: int, room: Any, wait_seconds: float) -> Dict[str, Any]:
    """Decode side: the KV of `room` from prefill's bootstrap server. It waits up to
    `wait_seconds` for prefill to receive the room, then as long as prefill is computing it."""
    base = f"http://{url_host(host)}:{port}/kv/{room}"
    deadline = time.monotonic() + wait_seconds
    last = "no attempt"
    while True:
        asked = max(0.0, min(KV_LONG_POLL_SECONDS, deadline - time.monotonic()))
        url = f"{base}?wait={asked:.3f}"
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=max(1.0, asked + 5)) as resp:
                body = resp.read().decode("utf-8")
                if resp.status != 202:
                    return json.loads(body)
            # 202: prefill has the room and is still computing it; its KV is on the way.
            deadline = time.monotonic() + wait_seconds
            continue
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace")[:300]
            last = f"HTTP {e.code} from {base}: {body}"
            if e.code != 404:
                break  # the prefill side reported a failure: do not wait for it
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            last = f"{type(e).__name__} from {base}: {e}"
        if time.monotonic() >= deadline:
            break
        if time.monotonic() - sent < asked / 2:
            # answered at once (refused, or a server that does not hold requests): pace retries
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    raise RequestError(
        500,
        f"Failed to receive kv chunk for room {room} from prefill bootstrap "
        f"{host}:{port}: {last}",
        "InternalServerError",
    )
