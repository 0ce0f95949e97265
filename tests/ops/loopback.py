"""A small PD deployment on loopback for the ops tests: the SGLang stand-in's groups (each rank on
its own 127.0.0.x, as on its own node), the real sglang-router's MiniLB, a /health server for
mc-master, and a fake SSH transport whose "nodes" run commands on this machine.

Every process a test starts, it stops (LoopbackProcesses.stop_all in the fixtures).
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from ops.remote import CommandTimeout, RemoteError, RemoteResult
from tests import fake_servers
from tests.conftest import REPO
from tests.outputs import complete_outputs

STANDIN_DIR = REPO / "sim" / "standin"
# Never let anything started here look for a hub or a proxy.
QUIET_ENV = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "NO_PROXY": "*",
             "no_proxy": "*"}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_status(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return -1


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class LoopbackProcesses:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: list[Proc] = []
        self.model_dir = directory / "model"  # an existing directory: nothing goes to a hub
        self.model_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        full_env = dict(os.environ) | QUIET_ENV | {"PYTHONUNBUFFERED": "1"}
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(STANDIN_DIR)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []))
        full_env |= env or {}
        log = self.directory / f"{name}.log"
        with open(log, "wb") as handle:
            popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=full_env,
                                     cwd=str(self.directory))
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=5)


@dataclass
class Group:
    name: str
    mode: str
    hosts: list[str]
    port: int
    boot: int
    procs: dict[int, Proc]

    @property
    def url(self) -> str:
        return f"http://{self.hosts[0]}:{self.port}"

    def health_url(self, rank: int) -> str:
        return f"http://{self.hosts[rank]}:{self.port}/health"


def start_group(procs: LoopbackProcesses, name: str, mode: str, hosts: list[str],
                env: dict[str, str] | None = None) -> Group:
    """One stand-in group, rank r on hosts[r]; the flags of every rank differ only in --host
    and --node-rank, as on the cluster."""
    port, dist, boot = free_port(), free_port(), free_port()
    flags = ["--model-path", str(procs.model_dir), "--trust-remote-code",
             "--tp-size", str(8 * len(hosts)), "--ep-size", str(8 * len(hosts)),
             "--nnodes", str(len(hosts)), "--dist-init-addr", f"{hosts[0]}:{dist}",
             "--port", str(port), "--disaggregation-mode", mode,
             "--disaggregation-transfer-backend", "mooncake",
             "--disaggregation-bootstrap-port", str(boot)]
    base_env = {"SGLANG_STANDIN_LOAD_SECONDS": "0.3",
                # a lost rank leaves rank 0 alive and unhealthy instead of exiting
                "SGLANG_STANDIN_WATCHDOG_SECONDS": "0"} | (env or {})
    started = {
        rank: procs.start(f"{name}-r{rank}",
                          [sys.executable, "-m", "sglang.launch_server", *flags,
                           "--host", host, "--node-rank", str(rank)], base_env)
        for rank, host in enumerate(hosts)}
    return Group(name, mode, hosts, port, boot, started)


def start_router(procs: LoopbackProcesses, prefill: Group, decode: Group, host: str) -> tuple[Proc, str]:
    port = free_port(host)
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--mini-lb", "--prefill", prefill.url, str(prefill.boot), "--decode", decode.url,
            "--host", host, "--port", str(port)]
    return procs.start("router", argv), f"http://{host}:{port}"


class HealthServer:
    """mc-master's metrics /health (always 200, as Mooncake's)."""

    def __init__(self, host: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, free_port(host)), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/health"
        fake_servers.serve(self.server)

    def stop(self) -> None:
        fake_servers.stop(self.server)


@dataclass
class LoopbackCluster:
    procs: LoopbackProcesses
    master: HealthServer
    prefill: Group
    decode: Group
    router: Proc
    router_url: str
    master_node: str = "127.0.0.1"
    router_node: str = "127.0.0.3"

    def outputs(self, restart_generation: int = 0, serving: bool = True) -> dict[str, Any]:
        """What `pulumi stack output --json` would say for this deployment."""
        containers = {"mooncake-master": {"node": self.master_node,
                                          "container": "kimipd-mooncake-master",
                                          "healthUrl": self.master.url}}
        groups = {}
        for group in (self.prefill, self.decode):
            for rank, host in enumerate(group.hosts):
                role = f"{group.name}-r{rank}"
                containers[role] = {"node": host, "container": f"kimipd-{role}",
                                    "healthUrl": group.health_url(rank)}
            groups[group.name] = {"mode": group.mode, "endpoint": group.url,
                                  "bootstrapPort": group.boot, "nodes": group.hosts}
        containers["router"] = {"node": self.router_node, "container": "kimipd-router",
                                "healthUrl": self.router_url + "/health"}
        nodes: dict[str, Any] = {}
        for role, entry in containers.items():
            nodes.setdefault(entry["node"], {"roles": [], "imageDigest": "loopback"})
            nodes[entry["node"]]["roles"].append(role)
        outputs = {"serving": serving, "restartGeneration": restart_generation,
                   "groups": groups, "nodes": nodes, "mooncakeMaster": "127.0.0.1:50051"}
        if serving:
            outputs |= {"containers": containers, "routerUrl": self.router_url,
                        "generateUrl": self.router_url + "/generate", "smokeTest": "x"}
        outputs = complete_outputs(outputs)
        # Loopback has no nftables table: the stack's firewall is off (a test turns it on).
        outputs["firewall"] = outputs["firewall"] | {"enabled": False}
        return outputs

    def containers(self) -> dict[tuple[str, str], Proc | None]:
        """(node, docker name) -> the process standing for that container (None: mc-master,
        a thread of the test)."""
        table: dict[tuple[str, str], Proc | None] = {
            (self.master_node, "kimipd-mooncake-master"): None,
            (self.router_node, "kimipd-router"): self.router}
        for group in (self.prefill, self.decode):
            for rank, host in enumerate(group.hosts):
                table[(host, f"kimipd-{group.name}-r{rank}")] = group.procs[rank]
        return table


def start_cluster(directory: Path, prefill_env: dict[str, str] | None = None,
                  decode_env: dict[str, str] | None = None, ranks: int = 2) -> LoopbackCluster:
    procs = LoopbackProcesses(directory)
    master = HealthServer("127.0.0.1")
    try:
        prefill = start_group(procs, "prefill", "prefill",
                              [f"127.0.0.{1 + r}" for r in range(ranks)], prefill_env)
        decode = start_group(procs, "decode", "decode",
                             [f"127.0.0.{3 + r}" for r in range(ranks)], decode_env)
        router, router_url = start_router(procs, prefill, decode, "127.0.0.3")
        for group in (prefill, decode):
            wait_until(lambda: http_status(group.health_url(0)) == 200, 30,
                       f"{group.name} rank 0 healthy")
            for rank in range(1, ranks):
                wait_until(lambda: http_status(group.health_url(rank)) == 200, 30,
                           f"{group.name} rank {rank}'s health server")
        wait_until(lambda: http_status(router_url + "/health") == 200, 30, "router up")
    except BaseException:
        procs.stop_all()
        master.stop()
        raise
    return LoopbackCluster(procs, master, prefill, decode, router, router_url)


def stop_cluster(cluster: LoopbackCluster) -> None:
    cluster.procs.stop_all()
    cluster.master.stop()


# -- a fake SSH transport: the "nodes" are this machine ---------------------------------------


class LocalNodes:
    """Transport whose nodes run commands in a local shell; `docker inspect` is answered from
    the processes standing for the containers. `unreachable` nodes fail like a refused SSH
    connection; `black_holes` wait out the timeout, as a node that never answers. On a node of
    `slow_engines` the first `docker inspect` outlasts its timeout, as a busy docker engine's."""

    def __init__(self, containers: dict[tuple[str, str], Proc | None], generation: str = "0",
                 unreachable: set[str] | None = None, black_holes: set[str] | None = None,
                 without_firewall: set[str] | None = None,
                 slow_engines: set[str] | None = None,
                 addresses: dict[str, list[str]] | None = None,
                 cut_answers: set[str] | None = None):
        self.containers = containers
        self.addresses = addresses
        # `nft list table ...` answers as on a node whose table is gone (nothing runs here:
        # this machine's own firewall is never read or touched).
        self.without_firewall = without_firewall or set()
        self.generation = generation
        self.unreachable = unreachable or set()
        self.black_holes = black_holes or set()
        self.slow_engines = set(slow_engines or ())
        # `docker inspect` there answers exit 0 with nothing on stdout (a channel closed early)
        self.cut_answers = set(cut_answers or ())
        self.commands: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        pass

    def _inspect(self, node: str, names: list[str]) -> RemoteResult:
        found, missing = [], []
        for name in names:
            if (node, name) not in self.containers:
                missing.append(name)
                continue
            proc = self.containers[(node, name)]
            code = proc.popen.poll() if proc else None
            started = (proc.started_at if proc else datetime.now(timezone.utc))
            found.append({
                "Name": "/" + name,
                "State": {"Status": "running" if code is None else "exited",
                          "ExitCode": 0 if code is None else (128 - code if code < 0 else code),
                          "StartedAt": started.strftime("%Y-%m-%dT%H:%M:%S.%f000Z"),
                          "FinishedAt": "0001-01-01T00:00:00Z"},
                "Config": {"Labels": {"kimipd.role": name.removeprefix("kimipd-"),
                                      "kimipd.restart-generation": self.generation}}})
        err = "".join(f"Error: No such container: {name}\n" for name in missing)
        return RemoteResult(node, "docker inspect", 1 if missing else 0,
                            json.dumps(found).encode(), err.encode())

    def run(self, node: str, command: str, timeout: float, stdin: bytes | None = None,
            on_stdout=None) -> RemoteResult:
        with self._lock:
            self.commands.append((node, command))
        if node in self.unreachable:
            raise RemoteError(f"ssh {node}:22: connection refused")
        if node in self.black_holes:
            time.sleep(timeout)
            raise RemoteError(f"ssh {node}:22: no answer within {timeout:g}s")
        argv = shlex.split(command)
        if argv[:3] == ["nft", "list", "table"]:
            if node in self.without_firewall:
                return RemoteResult(node, command, 1, b"", b"Error: No such file or directory\n")
            return RemoteResult(node, command, 0, b"", b"")
        if argv[:2] == ["ip", "-o"] and self.addresses is not None:
            device = argv[-1]
            lines = "".join(f"2: {device}    inet {address}/32 scope global {device}\\       "
                            "valid_lft forever preferred_lft forever\n"
                            for address in self.addresses.get(node, []))
            return RemoteResult(node, command, 0, lines.encode(), b"")
        if argv[:2] == ["docker", "inspect"]:
            if node in self.slow_engines:
                self.slow_engines.discard(node)
                time.sleep(timeout)
                raise CommandTimeout(f"ssh {node}: `docker inspect` did not finish within "
                                     f"{timeout:g}s")
            if node in self.cut_answers:
                return RemoteResult(node, command, 0, b"", b"")
            return self._inspect(node, [a for a in argv[2:] if not a.startswith("-")
                                        and a != "container"])
        # A session of its own: a command past its timeout goes with whatever it started.
        popen = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=os.environ | QUIET_ENV, start_new_session=True)
        try:
            return self._collect(node, command, popen, timeout, stdin, on_stdout)
        finally:
            if popen.poll() is None:
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)
            popen.stdout.close()
            popen.stderr.close()

    @staticmethod
    def _collect(node: str, command: str, popen: subprocess.Popen, timeout: float,
                 stdin: bytes | None, on_stdout) -> RemoteResult:
        """POPEN's output until it ends, within TIMEOUT as the SSH transport's (CommandTimeout
        past it); stdout in chunks as they come, as the SSH transport hands them over (verify
        times them)."""
        if stdin:
            popen.stdin.write(stdin)
        popen.stdin.close()
        deadline = time.monotonic() + timeout
        stdout, stderr = bytearray(), bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(popen.stdout, selectors.EVENT_READ, stdout)
            selector.register(popen.stderr, selectors.EVENT_READ, stderr)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommandTimeout(f"ssh {node}: `{command}` did not finish within "
                                         f"{timeout:g}s")
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    key.data.extend(chunk)
                    if key.data is stdout and on_stdout is not None:
                        on_stdout(chunk)
        try:
            status = popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"ssh {node}: `{command}` did not finish within "
                                 f"{timeout:g}s") from None
        return RemoteResult(node, command, status, bytes(stdout), bytes(stderr))
