#!/usr/bin/env python3
"""Starts the rust router (smg) with its API key read from a file, never from the command line,
and beside it, where the door checks the slot, the slot's pair check.

  router-launch.py --api-key-file FILE [--pair-check-port PORT] -- ROUTER-ARGS...

The key is appended to the router's own argv inside this process (sys.argv), so `ps` and
`docker inspect` show the file's path, not the key.

The pair check answers GET on PORT: 200 when the router holds a healthy prefill and a healthy
decode of one pairing protocol (the groups' serving contract, which every registration
carries), else 503 with the reason. The router's own /readiness counts healthy workers of each
mode and ignores pairing, so a slot holding only a prefill of one contract and a decode of
another would stay in the door's rotation and answer every request 503 no_compatible_pd_pair.
It lives in the router's process, so it ends with it, and reads the router on loopback with
the key it already holds.
"""

import http.server
import json
import runpy
import sys
import threading
import urllib.error
import urllib.request

ROUTER_MODULE = "smg.launch_router"


def option(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv[:-1] else default


def compatible_pairs(workers: list[dict]) -> list[str]:
    """The pairing protocols of which a healthy prefill and a healthy decode are registered
    (a worker draining after its removal does not count)."""
    by_mode: dict[str, set[str]] = {"prefill": set(), "decode": set()}
    for worker in workers:
        if worker.get("is_healthy") and worker.get("status", "ready") != "draining":
            pairing = str(worker.get("pd_pairing") or worker.get("pairing_protocol") or "")
            by_mode.setdefault(str(worker.get("worker_type")), set()).add(pairing)
    return sorted(by_mode["prefill"] & by_mode["decode"])


def pair_check(router_url: str, key: str) -> tuple[int, dict]:
    request = urllib.request.Request(router_url + "/workers",
                                     headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            workers = json.loads(response.read().decode()).get("workers") or []
    except (urllib.error.URLError, OSError, ValueError) as error:
        return 503, {"ready": False, "reason": f"the router does not answer GET /workers: {error}"}
    pairs = compatible_pairs(workers)
    if not pairs:
        return 503, {"ready": False, "reason": "no healthy prefill and decode of one pairing "
                                               "protocol", "workers": len(workers)}
    return 200, {"ready": True, "pairs": pairs}


def serve_pair_check(host: str, port: int, router_url: str, key: str) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, body = pair_check(router_url, key)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # the door asks twice a second: no log line
            return

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="pair-check", daemon=True).start()


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 3 or argv[0] != "--api-key-file":
        sys.exit("usage: router-launch.py --api-key-file FILE [--pair-check-port PORT] -- "
                 "ROUTER-ARGS...")
    key_file, rest = argv[1], argv[2:]
    check_port = None
    if rest[:1] == ["--pair-check-port"] and len(rest) >= 2:
        check_port, rest = int(rest[1]), rest[2:]
    if rest[:1] != ["--"]:
        sys.exit("usage: router-launch.py --api-key-file FILE [--pair-check-port PORT] -- "
                 "ROUTER-ARGS...")
    router_args = rest[1:]
    with open(key_file, encoding="utf-8") as stream:
        key = stream.read().strip()
    if not key:
        sys.exit(f"router-launch.py: {key_file} is empty; the router would run without a key")
    if check_port is not None:
        port = option(router_args, "--port", "30000")
        serve_pair_check(option(router_args, "--host", "0.0.0.0"), check_port,
                         f"http://127.0.0.1:{port}", key)
    sys.argv = [ROUTER_MODULE, *router_args, "--api-key", key]
    runpy.run_module(ROUTER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
