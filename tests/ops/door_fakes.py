"""A stack with the door on loopback for the ops tests, every part a fake a test steers: two
router slots (HTTP servers answering /health, /readiness and a rust router's GET /workers with
its key), the door (its port, its exporter's /health, optionally TLS) and HAProxy's runtime API
(a UNIX socket answering `show stat` as HAProxy 2.6 does), one rank per group and mc-master.

The "nodes" are this machine (tests/ops/loopback.py's LocalNodes): `docker inspect` is answered
from FakeContainer states, any other command runs here, so the python3 that reads the runtime
API really connects to the fake socket.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import socket
import ssl
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.ops.loopback import LocalNodes, free_port
from tests.outputs import complete_outputs

KEY = "door-test-key"
MASTER_NODE, PREFILL_NODE, DECODE_NODE, ROUTER_NODE = (
    "127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4")
# With the door on two nodes: the other door node (slot b's) and the address they share.
OTHER_DOOR_NODE, VIRTUAL_IP = "127.0.1.5", "127.0.1.100"
OTHER_DOOR, OTHER_KEEPALIVED = "door-127-0-1-5", "keepalived-127-0-1-5"

# HAProxy 2.6's `show stat` header (every column it prints, in its order).
STAT_COLUMNS = (
    "pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,"
    "wredis,status,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,"
    "lbtot,tracked,type,rate,rate_lim,rate_max,check_status,check_code,check_duration,hrsp_1xx,"
    "hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,hanafail,req_rate,req_rate_max,req_tot,"
    "cli_abrt,srv_abrt,comp_in,comp_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,qtime,"
    "ctime,rtime,ttime,agent_status,agent_code,agent_duration,check_desc,agent_desc,"
    "check_rise,check_fall,check_health,agent_rise,agent_fall,agent_health,addr,cookie,mode,"
    "algo,conn_rate,conn_rate_max,conn_tot,intercepted,dcon,dses,wrew,connect,reuse,"
    "cache_lookups,cache_hits,srv_icur,src_ilim,qtime_max,ctime_max,rtime_max,ttime_max,"
    "eint,idle_conn_cur,safe_conn_cur,used_conn_cur,need_conn_est,uweight,agg_server_status,"
    "agg_server_check_status,agg_check_status,-,ssl_sess,ssl_reused_sess,ssl_failed_handshake,"
    "h2_headers_rcvd,h2_data_rcvd,h2_settings_rcvd,h2_rst_stream_rcvd,h2_goaway_rcvd,"
    "h2_detected_conn_protocol_errors,h2_detected_strm_protocol_errors,h2_rst_stream_resp,"
    "h2_goaway_resp,h2_open_connections,h2_backend_open_streams,h2_total_connections,"
    "h2_backend_total_streams,").split(",")


def show_stat(servers: dict[str, dict[str, str]]) -> str:
    """`show stat` as HAProxy prints it: the header, the frontends, each server of the backend
    `slots`, the backend's own line; every line ends with a comma, then an empty line."""
    def line(values: dict[str, str]) -> str:
        return ",".join(values.get(column, "") for column in STAT_COLUMNS[:-1]) + ","

    lines = ["# " + ",".join(STAT_COLUMNS[:-1]) + ","]
    lines.append(line({"pxname": "door", "svname": "FRONTEND", "scur": "1", "status": "OPEN",
                       "type": "0"}))
    lines.append(line({"pxname": "exporter", "svname": "FRONTEND", "status": "OPEN",
                       "type": "0"}))
    up = 0
    for server, fields in servers.items():
        up += fields.get("status", "UP").startswith("UP")
        lines.append(line({"pxname": "slots", "svname": server, "scur": "0", "status": "UP",
                           "weight": "1", "act": "1", "lastchg": "302", "type": "2",
                           "check_status": "L7OK", "check_code": "200",
                           "addr": "127.0.0.1:31001"} | fields))
    lines.append(line({"pxname": "slots", "svname": "BACKEND", "scur": "0",
                       "status": "UP" if up else "DOWN", "type": "1"}))
    return "\n".join(lines) + "\n\n"


class AdminSocket:
    """HAProxy's runtime API on a UNIX socket: one command per connection, then closed."""

    def __init__(self) -> None:
        # A short path: a UNIX socket's name has at most 107 bytes.
        self.directory = tempfile.mkdtemp(prefix="kimipd-door-")
        self.path = os.path.join(self.directory, "admin.sock")
        self.servers: dict[str, dict[str, str]] = {"slot-a": {}, "slot-b": {}}
        self.commands: list[str] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(16)
        self._stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stopped:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                command = b""
                while not command.endswith(b"\n"):
                    chunk = connection.recv(1024)
                    if not chunk:
                        break
                    command += chunk
                text = command.decode().strip()
                self.commands.append(text)
                if text == "show stat":
                    answer = show_stat(self.servers)
                elif text == "show servers state":
                    answer = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state\n"
                else:
                    answer = "Unknown command.\n"
                connection.sendall(answer.encode())

    def stop(self) -> None:
        """Its socket gone, as a dead door's (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        # close() alone leaves the accept() in _serve blocked on the socket for good (a thread
        # and the socket kept per test); shutdown() wakes it.
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.rmdir(self.directory)


class _QuietServer(ThreadingHTTPServer):
    # status probes every row at once; with socketserver's backlog of 5, a busy machine (the
    # other test session beside) once saw a probe's connection dropped unanswered.
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        # A health checker (HAProxy's) that resets the connection once it has the status line
        # is no error. Anything else closes a probe's connection unanswered, which the probe
        # reports as "Server disconnected": its traceback goes to the test's captured stderr.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Server:
    """A ThreadingHTTPServer on HOST whose GET/POST answers come from `answer`."""

    def __init__(self, host: str, tls: ssl.SSLContext | None = None) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body = owner.answer(self.command, self.path,
                                            self.headers.get("Authorization"))
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = _reply  # noqa: N815
            do_POST = _reply  # noqa: N815

            def log_message(self, *args):
                pass

        self._handler, self._tls = Handler, tls
        self.host, self.port = host, free_port(host)
        self._serve()

    def _serve(self) -> None:
        self.server = _QuietServer((self.host, self.port), self._handler)
        if self._tls is not None:
            self.server.socket = self._tls.wrap_socket(self.server.socket, server_side=True)
        self.stopped = False
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def restart(self) -> None:
        """Serving again on the same port, as a replaced container's server does."""
        self.stop()
        self._serve()

    def answer(self, method: str, path: str, authorization: str | None) -> tuple[int, Any]:
        raise NotImplementedError

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        # socketserver's shutdown() waits without a bound for serve_forever to say it ended; in
        # CI one such wait once never ended (the test hit pytest's timeout in its teardown). A
        # fake's stop is bounded: the port is closed whether or not the loop has said so.
        stopping = threading.Thread(target=self.server.shutdown, daemon=True)
        stopping.start()
        stopping.join(10)
        self.server.server_close()  # the port refuses connections from now on

    stopped = False


class HealthOnly(_Server):
    def __init__(self, host: str) -> None:
        self.healthy = True
        super().__init__(host)

    def answer(self, method, path, authorization):
        return (200 if self.healthy else 503), {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class FakeSlot(_Server):
    """A rust router slot: /health (alive), /readiness and /pairs (ready), GET /workers with the
    key, POST /generate."""

    def __init__(self, host: str, groups: dict[str, HealthOnly]) -> None:
        self.ready = True
        self.kind = "rust"
        # group -> (registered, healthy, load)
        self.members = {name: (True, True, 0) for name in groups}
        self.endpoints = {name: server.url for name, server in groups.items()}
        self.requests: list[tuple[str, str, str | None]] = []
        super().__init__(host)

    def answer(self, method, path, authorization):
        self.requests.append((method, path, authorization))
        if path == "/health":
            return 200, {"status": "ok"}
        # /pairs: the pair check beside a rust router (on its own port there; on the slot's here).
        if path in ("/readiness", "/pairs"):
            return (200, {"status": "ready"}) if self.ready else (503, {"status": "not_ready"})
        if path == "/generate" and method == "POST":
            return 200, {"text": "pong"}
        if path == "/restore" and method == "POST":
            # What router-members.py restore does to it: every group registered (the outputs'
            # restore command posts here).
            self.members = {name: (True, True, 0) for name in self.members}
            return 200, {}
        if path == "/workers" and self.kind == "rust":
            if authorization != f"Bearer {KEY}":
                return 401, {"error": "unauthorized"}
            workers = [{"id": f"w{i}", "url": self.endpoints[name],
                        "worker_type": name.split("-")[0], "is_healthy": healthy, "load": load,
                        "model_id": "m", "priority": 50, "cost": 1.0,
                        "connection_mode": "http"}
                       for i, (name, (registered, healthy, load))
                       in enumerate(self.members.items()) if registered]
            return 200, {"workers": workers, "total": len(workers), "stats": {}}
        return 404, {"error": "not found"}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class FakeDoor(_Server):
    """The door's port: /health and /generate answered while a slot serves (as HAProxy sends
    them to one), 503 from HAProxy itself when none does."""

    def __init__(self, host: str, slots: dict[str, FakeSlot], admin: AdminSocket,
                 tls: ssl.SSLContext | None = None) -> None:
        self.slots = slots
        self.admin = admin
        super().__init__(host, tls)

    def answer(self, method, path, authorization):
        serving = [name for name in self.slots
                   if self.admin.servers[f"slot-{name}"].get("status", "UP").startswith("UP")]
        if not serving:
            return 503, b"<html><body><h1>503 Service Unavailable</h1></body></html>"
        return 200, {"text": "pong"} if path == "/generate" else {"status": "ok"}


@dataclass
class FakeContainer:
    """What LocalNodes' `docker inspect` reads off a container's stand-in (poll: None while it
    runs, else the exit status as Popen gives it, -9 for a SIGKILL)."""

    exit_code: int | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def popen(self) -> FakeContainer:
        return self

    def poll(self) -> int | None:
        return self.exit_code


def certificate_pair(directory: Path, host: str) -> tuple[str, ssl.SSLContext]:
    """A CA and a server certificate for HOST signed by it: (the CA's PEM, the server's
    context)."""
    now = datetime.now(timezone.utc)

    def build(subject: str, key, issuer_name, issuer_key, ca: bool):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kimipd test CA")])
    ca = build("kimipd test CA", ca_key, ca_name, ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build(host, key, ca_name, ca_key, False)
    pem = lambda c: c.public_bytes(serialization.Encoding.PEM).decode()  # noqa: E731
    chain = directory / "door.pem"
    chain.write_text(pem(cert) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return pem(ca), context


class DoorStack:
    """mc-master, one prefill and one decode group (a rank each), the door and its two slots.
    TWO_NODES: the door on ROUTER_NODE and OTHER_DOOR_NODE (slot b there), each with its
    keepalived and its own runtime API (`admins`), and the door's port on VIRTUAL_IP, held by
    the nodes in `holders` (what their `ip -o -4 addr show` lists; the port answers as the
    holder's door would) while each keepalived's state file says what `keepalived(...)` last
    wrote."""

    def __init__(self, directory: Path, tls: bool = False, two_nodes: bool = False) -> None:
        self.two_nodes = two_nodes
        # router.node's state directory: the rollout's record (assets/rollout_state.py) is
        # written there by a test as the node scripts would.
        self.state_dir = directory / "router-state"
        self.state_dir.mkdir(exist_ok=True)
        self.master = HealthOnly(MASTER_NODE)
        self.groups = {"prefill": HealthOnly(PREFILL_NODE), "decode": HealthOnly(DECODE_NODE)}
        self.slots = {name: FakeSlot(OTHER_DOOR_NODE if two_nodes and name == "b"
                                     else ROUTER_NODE, self.groups) for name in ("a", "b")}
        self.admin = AdminSocket()
        self.exporter = HealthOnly(ROUTER_NODE)  # the door's monitor-uri: its healthUrl
        self.ca: str | None = None
        context = None
        self.door_host = VIRTUAL_IP if two_nodes else ROUTER_NODE
        if tls:
            self.ca, context = certificate_pair(directory, self.door_host)
        self.door = FakeDoor(self.door_host, self.slots, self.admin, context)
        self.tls = tls
        self.containers: dict[str, FakeContainer] = {
            role: FakeContainer() for role in ("mooncake-master", "prefill-r0", "decode-r0",
                                               "door", "router-a", "router-b")}
        self.addresses: dict[str, list[str]] = {}
        self.state_files: dict[str, Path] = {}
        self.admins = {ROUTER_NODE: self.admin}
        if two_nodes:
            self.admins[OTHER_DOOR_NODE] = AdminSocket()
            self.other_exporter = HealthOnly(OTHER_DOOR_NODE)
            self.containers |= {role: FakeContainer() for role in
                                (OTHER_DOOR, "keepalived", OTHER_KEEPALIVED)}
            self.state_files = {node: directory / f"keepalived-{node}.state"
                                for node in (ROUTER_NODE, OTHER_DOOR_NODE)}
            self.hold(ROUTER_NODE)
            self.keepalived(ROUTER_NODE, "MASTER")
            self.keepalived(OTHER_DOOR_NODE, "BACKUP")

    def hold(self, *nodes: str) -> None:
        """The virtual IP is on these door nodes' interfaces (none, one, or both: split brain)."""
        for node in (ROUTER_NODE, OTHER_DOOR_NODE):
            self.addresses[node] = [node, VIRTUAL_IP] if node in nodes else [node]
        if len(nodes) == 1:
            self.door.admin = self.admins[nodes[0]]

    def keepalived(self, node: str, state: str) -> None:
        """What keepalived's notify script last wrote on NODE."""
        self.state_files[node].write_text(state + "\n")

    @property
    def door_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.door_host}:{self.door.port}"

    def outputs(self) -> dict[str, Any]:
        node_of = {"mooncake-master": MASTER_NODE, "prefill-r0": PREFILL_NODE,
                   "decode-r0": DECODE_NODE}
        containers = {
            "mooncake-master": {"node": MASTER_NODE, "container": "kimipd-mooncake-master",
                                "healthUrl": self.master.url + "/health"},
            "prefill-r0": {"node": PREFILL_NODE, "container": "kimipd-prefill-r0",
                           "healthUrl": self.groups["prefill"].url + "/health"},
            "decode-r0": {"node": DECODE_NODE, "container": "kimipd-decode-r0",
                          "healthUrl": self.groups["decode"].url + "/health"},
            "door": {"node": ROUTER_NODE, "container": "kimipd-door",
                     "healthUrl": self.exporter.url + "/health"},
        }
        for name, slot in self.slots.items():
            containers[f"router-{name}"] = {"node": slot.host,
                                            "container": f"kimipd-router-{name}",
                                            "healthUrl": slot.url + "/health"}
        groups = {name: {"mode": name, "endpoint": server.url, "bootstrapPort": 8998,
                         "nodes": [node_of[f"{name}-r0"]]}
                  for name, server in self.groups.items()}
        door = {
            "url": self.door_url, "tls": self.tls, "node": ROUTER_NODE,
            "metricsUrl": self.exporter.url + "/metrics", "adminSocket": self.admin.path,
            "container": "kimipd-door",
            "slots": {name: {"url": slot.url, "port": slot.port, "metricsPort": 29001 + i,
                             "container": f"kimipd-router-{name}", "server": f"slot-{name}",
                             "role": f"router-{name}",
                             "restore": f"curl -sf -o /dev/null -X POST {slot.url}/restore"}
                      for i, (name, slot) in enumerate(self.slots.items())},
            "stateDir": str(self.state_dir),
        }
        nodes = [MASTER_NODE, PREFILL_NODE, DECODE_NODE, ROUTER_NODE]
        if self.two_nodes:
            nodes.append(OTHER_DOOR_NODE)
            self._two_door_nodes(containers, door)
        return complete_outputs({"serving": True, "restartGeneration": 0, "groups": groups,
                                 "nodes": {node: {"roles": []} for node in nodes},
                                 "containers": containers, "door": door,
                                 "routerUrl": self.door_url,
                                 "generateUrl": self.door_url + "/generate"})

    def _two_door_nodes(self, containers: dict[str, Any], door: dict[str, Any]) -> None:
        """The outputs' parts a door on two nodes adds (components/cluster.py's door_output)."""
        vip_health = self.door_url + "/health"  # keepalived's gate: the door through the VIP
        containers |= {
            OTHER_DOOR: {"node": OTHER_DOOR_NODE, "container": "kimipd-door",
                         "healthUrl": self.other_exporter.url + "/health"},
            "keepalived": {"node": ROUTER_NODE, "container": "kimipd-keepalived",
                           "healthUrl": vip_health},
            OTHER_KEEPALIVED: {"node": OTHER_DOOR_NODE, "container": "kimipd-keepalived",
                               "healthUrl": vip_health}}
        for name, slot in self.slots.items():
            door["slots"][name]["node"] = slot.host
        door["nodes"] = {
            node: {"role": door_role, "container": "kimipd-door",
                   "metricsUrl": exporter.url + "/metrics",
                   "adminSocket": self.admins[node].path,
                   "keepalived": {"role": keepalived_role, "container": "kimipd-keepalived",
                                  "stateFile": str(self.state_files[node])},
                   "peer": peer}
            for node, door_role, keepalived_role, exporter, peer in (
                (ROUTER_NODE, "door", "keepalived", self.exporter, OTHER_DOOR_NODE),
                (OTHER_DOOR_NODE, OTHER_DOOR, OTHER_KEEPALIVED, self.other_exporter,
                 ROUTER_NODE))}
        door["virtualIp"] = {"address": VIRTUAL_IP, "prefixLength": 32, "interface": "bond1",
                             "vrid": 51, "advertIntervalMs": 100, "checkFile": "/nonexistent"}

    def nodes(self, **kwargs) -> LocalNodes:
        by_role = self.outputs()["containers"]
        if self.two_nodes:
            kwargs.setdefault("addresses", self.addresses)
        return LocalNodes({(by_role[role]["node"], by_role[role]["container"]): container
                           for role, container in self.containers.items()}, **kwargs)

    def kill(self, role: str) -> None:
        """The container exits as after a SIGKILL (docker says 137)."""
        self.containers[role].exit_code = -9

    def replace(self, role: str) -> None:
        """What an update's replacement does: a new container of ROLE that runs and, for a
        slot's router, serves on its port again with every group (its restore)."""
        self.containers[role] = FakeContainer()
        name = role.removeprefix("router-")
        if name in self.slots and role.startswith("router-"):
            self.slots[name].restart()
            self.admin.servers[f"slot-{name}"] = {"status": "UP", "check_status": "L7OK",
                                                   "check_code": "200", "lastchg": "1"}

    def kill_slot(self, name: str) -> None:
        """A slot's router SIGKILLed: its port refuses, the door's checks mark it DOWN."""
        self.kill(f"router-{name}")
        self.slots[name].stop()
        self.admin.servers[f"slot-{name}"] = {"status": "DOWN", "check_status": "L4CON",
                                               "check_code": "", "lastchg": "4"}

    def stop(self) -> None:
        others = [self.other_exporter] if self.two_nodes else []
        for server in (self.master, *self.groups.values(), *self.slots.values(), self.exporter,
                       self.door, *others):
            server.stop()
        for admin in self.admins.values():
            admin.stop()
