"""The door: HAProxy's configuration, its files on the router's node, and its container.

HAProxy 2.6 (the official image on the nodes, Debian 12's package on the sim) owns router.port
and sends each request to one of two router slots on their own ports; a slot is drained at the
door (runtime API) before it is replaced, and a connection refused by a dying slot is retried
on the other one, never a request that reached a router (a PD dispatch is not idempotent:
upstream SGLang PR #34570). docs/door.md.
"""

from __future__ import annotations

import dataclasses
import hashlib

from ..config import ClusterConfig
from ..config.router_schema import PROGRAM_CLIENT, SLOT_NAMES, DoorSpec
from .container_plan import ContainerPlan, container_plan
from .layout import container_name, router_state_dir, shell

DOOR = "door"
# Found on the image's PATH: /usr/local/sbin in the official image, /usr/sbin in Debian's package.
HAPROXY = "haproxy"
# Root in the container, whatever the image's own user (the official image's is uid 99): the
# door's directory, its admin socket and the TLS key are root's only (docs/decisions.md).
DOOR_USER = "0:0"
BACKEND = "slots"


def door_spec(cfg: ClusterConfig) -> DoorSpec:
    if cfg.router.door is None:
        raise ValueError("router.door is not set")
    return cfg.router.door


def slot_role(slot: str) -> str:
    return f"router-{slot}"


def slot_server(slot: str) -> str:
    """The slot's server name in the door's backend (and in the runtime API)."""
    return f"slot-{slot}"


def door_dir(cfg: ClusterConfig | int) -> str:
    """The door's own directory on the router's node, the only one it mounts (read-write: the
    admin socket lives there). CFG or router.port."""
    return f"{router_state_dir(cfg)}/door"


def door_config_file(cfg: ClusterConfig) -> str:
    return f"{door_dir(cfg)}/haproxy.cfg"


def door_admin_socket(cfg: ClusterConfig) -> str:
    return f"{door_dir(cfg)}/admin.sock"


def door_state_file(cfg: ClusterConfig) -> str:
    return f"{door_dir(cfg)}/servers.state"


def door_clients_map(cfg: ClusterConfig | int) -> str:
    """`DIGEST NAME` per client key (router.door.clientKeys, and the program's own): the door
    names a request's client from its key's sha256. Digests only, never a key."""
    return f"{door_dir(cfg)}/clients.map"


def door_internal_key_map(cfg: ClusterConfig | int) -> str:
    """One entry, `router KEY`: the internal key (routerApiKey) the door sends the routers in
    place of a client's key. Root's only, as the door's directory is."""
    return f"{door_dir(cfg)}/internal-key.map"


# The door's count of requests per client (a stick table; `show table` in its runtime API).
CLIENTS_TABLE = "door_clients"
# HAProxy 2.6's `option httplog` format, with the client's name after it.
HTTPLOG_FORMAT = ("%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %CC %CS %tsc "
                  "%ac/%fc/%bc/%sc/%rc %sq/%bq %hr %hs %{+Q}r")


def key_digest(key: str) -> str:
    """What the door compares: the sha256 of the key a client sends, in lower-case hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def door_clients_map_text(cfg: ClusterConfig, program_key_digest: str) -> str:
    """clients.map: each client's key digest and name, the program's own (routerApiKey's
    digest, PROGRAM_KEY_DIGEST) first."""
    clients = {PROGRAM_CLIENT: program_key_digest, **door_spec(cfg).client_keys}
    return "".join(f"{digest} {name}\n" for name, digest in clients.items())


# Run in the door's container (it has socat), with the admin socket, clients.map and
# internal-key.map as $1-$3: the new maps (FILE.new) replace what the running door holds, each in
# one step (a new version of the clients' map, committed whole; the one internal key set), with
# no reload. A door whose configuration does not use the maps yet (keys just turned on) is left
# to its reload, which reads the files.
SWAP_MAPS_SCRIPT = r"""set -eu
ask() { out=$(echo "$1" | socat stdio "unix-connect:$socket"); printf '%s' "$out"; }
quiet() { out=$(ask "$1"); [ -z "$out" ] || { echo "door runtime API: $out" >&2; exit 1; }; }
socket=$1 clients=$2 internal=$3
ask 'show map' | grep -qF "($clients)" || { echo 'the door reads the keys at its reload'; exit 0; }
version=$(ask "prepare map $clients" | sed -n 's/.*created: \([0-9]*\).*/\1/p')
[ -n "$version" ] || { echo 'door runtime API: prepare map gave no version' >&2; exit 1; }
while read -r digest name; do quiet "add map @$version $clients $digest $name"; done \
  < "$clients.new"
quiet "commit map @$version $clients"
key=$(sed -n 's/^router //p' "$internal.new")
quiet "set map $internal router $key"
echo 'the running door holds the new keys'"""


def door_clients_command(cfg: ClusterConfig) -> str:
    """stdin: the internal key (routerApiKey) on its first line, then clients.map
    (door_clients_map_text). Both files written root-only, swapped into a running door through
    its runtime API (no reload, no request refused), then moved into place for its next load.
    The key is read by the shells' builtins: it is on no command line."""
    clients, internal = door_clients_map(cfg), door_internal_key_map(cfg)
    door = container_name(DOOR)
    swap = shell(["docker", "exec", door, "sh", "-c", SWAP_MAPS_SCRIPT, "sh",
                  door_admin_socket(cfg), clients, internal])
    return "\n".join([
        "set -eu",
        "umask 077",
        f"mkdir -p {shell([door_dir(cfg)])}",
        "IFS= read -r key",
        f"printf 'router %s\\n' \"$key\" > {shell([internal + '.new'])}",
        f"cat > {shell([clients + '.new'])}",
        f"if {container_running(door)}; then {swap}; fi",
        f"mv {shell([internal + '.new', internal])}",
        f"mv {shell([clients + '.new', clients])}",
    ])


def remove_door_clients_command(cfg: ClusterConfig) -> str:
    """Client keys turned off: the maps go (the door's configuration no longer reads them; its
    update runs first, as the deletes of an `up` come last)."""
    return f"rm -f {shell([door_clients_map(cfg), door_internal_key_map(cfg)])}"


def door_tls_file(cfg: ClusterConfig) -> str:
    """Certificate chain and key in one PEM (HAProxy's `crt`); mode 0600, written from stdin."""
    return f"{door_dir(cfg)}/tls.pem"


def door_ca_file(cfg: ClusterConfig | int) -> str:
    """What the program's own clients on the node (the smoke test, verify over SSH) verify the
    door against. CFG or router.port."""
    return f"{door_dir(cfg)}/ca.pem"


def door_url(cfg: ClusterConfig) -> str:
    """Where clients reach the door: router.node, or the virtual IP when the door stands on two
    nodes (whichever holds it answers)."""
    door = door_spec(cfg)
    scheme = "https" if door.tls is not None else "http"
    host = door.virtual_ip.address if door.virtual_ip is not None else cfg.router.node
    return f"{scheme}://{host}:{cfg.router.port}"


def door_health_url(cfg: ClusterConfig, address: str | None = None) -> str:
    """The door's own liveness (HAProxy's monitor-uri on the exporter's plain-HTTP port): up even
    while no slot is. ADDRESS: the door node (unset: router.node)."""
    return f"http://{address or cfg.router.node}:{door_spec(cfg).metrics_port}/health"


def slot_port(cfg: ClusterConfig, slot: str) -> int:
    return door_spec(cfg).slot_named()[slot].port


def slot_url(cfg: ClusterConfig, slot: str) -> str:
    return f"http://{cfg.slot_node(slot)}:{slot_port(cfg, slot)}"


def slot_server_address(cfg: ClusterConfig, slot: str) -> str:
    """Where the door sends to SLOT: on loopback when the door stands on router.node alone;
    with two door nodes, at the slot's node, so that each door sends to both slots."""
    host = "127.0.0.1" if door_spec(cfg).nodes is None else cfg.slot_node(slot)
    return f"{host}:{slot_port(cfg, slot)}"


def slot_check_path(cfg: ClusterConfig | str) -> str:
    """What the door asks a slot (its httpchk), for CFG's router kind (or the kind itself, as
    `kimipd status` knows it): beside the rust router, its pair check (on the slot's check
    port) is 200 while it holds a healthy prefill and decode of one contract (smg's own
    /readiness ignores pairing); MiniLB has no readiness, its /health is liveness."""
    kind = cfg if isinstance(cfg, str) else cfg.router.kind
    return "/pairs" if kind == "rust" else "/health"


def slot_check_url(cfg: ClusterConfig, slot: str) -> str:
    """Where the door's check of SLOT goes (its pair check beside a rust router, else its
    own port), at the slot's node."""
    spec = door_spec(cfg).slot_named()[slot]
    port = spec.check_port if cfg.router.kind == "rust" else spec.port
    return f"http://{cfg.slot_node(slot)}:{port}{slot_check_path(cfg)}"


def door_haproxy_config(cfg: ClusterConfig) -> str:
    """haproxy.cfg, the door's whole behaviour (it is the config command's stdin, so the preview
    shows every change of it)."""
    door = door_spec(cfg)
    router = cfg.router
    # A request may take router.requestTimeoutSeconds end to end (a stream included); the door
    # must not cut it first.
    longest = router.request_timeout_seconds + 30 if router.kind == "rust" else 3600
    bind = f"bind {router.host}:{router.port}"
    if door.tls is not None:
        # HTTP/1.1 only: over HTTP/2 a 503 of the door reached curl as a cancelled stream with
        # no status (docs/decisions.md).
        bind += f" ssl crt {door_tls_file(cfg)} alpn http/1.1"
    interval = door.health_check_interval_ms
    lines = [
        "# kimipd door: HAProxy owns router.port in front of two router slots (docs/door.md).",
        "# Rendered by components/render/door.py; slot states change through the admin socket.",
        "global",
        "    master-worker",
        # expose-fd: a successor (the bridge, a new door: door_plan's -x) takes the listening
        # sockets over from this process, so a new door image refuses no connection.
        f"    stats socket {door_admin_socket(cfg)} mode 600 level admin expose-fd listeners",
        "    stats timeout 30s",
        "    log stdout format raw local0",
        # A reload forgets a slot's drain; the config command saves the states first.
        f"    server-state-file {door_state_file(cfg)}",
        # A reload keeps the listener; the old worker finishes its streams, at most this long.
        f"    hard-stop-after {longest}s",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    load-server-state-from-file global",
        "    timeout connect 2s",
        f"    timeout client {longest}s",
        f"    timeout server {longest}s",
        "    timeout http-request 30s",
        "    timeout http-keep-alive 10s",
        "    timeout queue 30s",
        "    timeout check 2s",
        # A connection a slot refused (stopping, dead) goes to the other slot; a request that
        # reached a router is never sent again (SGLang PR #34570: PD legs are not idempotent).
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure",
        "",
        "frontend door",
        f"    {bind}",
        *(_client_key_lines(cfg) if door.client_keys else [
            # The access log (`kimipd logs --role door`): client, slot, timings, status, bytes.
            "    option httplog"]),
        f"    default_backend {BACKEND}",
        "",
        "frontend exporter",
        f"    bind {router.host}:{door.metrics_port}",
        "    monitor-uri /health",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    no log",
        "",
        f"backend {BACKEND}",
        # Streams are long: the slot with fewer open requests gets the next one.
        "    balance leastconn",
        f"    option httpchk GET {slot_check_path(cfg)}",
        "    http-check expect status 200",
        f"    default-server inter {interval} fastinter {interval} downinter {interval} "
        "fall 2 rise 2",
    ]
    for slot in SLOT_NAMES:
        check = "check"
        if router.kind == "rust":
            check += f" port {door.slot_named()[slot].check_port}"
        lines.append(f"    server {slot_server(slot)} {slot_server_address(cfg, slot)} {check}")
    if door.client_keys:
        lines += ["", f"backend {CLIENTS_TABLE}",
                  "    stick-table type string len 32 size 1k store http_req_cnt"]
    return "\n".join(lines) + "\n"


def _client_key_lines(cfg: ClusterConfig) -> list[str]:
    """The door checks each client's key (router.door.clientKeys): a key it does not know gets
    401 here, before any router; a known one is named, counted, and swapped for the internal
    key, so no client holds the key the routers and servers take."""
    unknown = '{"error": "unknown or missing API key: send Authorization: Bearer KEY"}'
    return [
        # The client's name from its key's digest: the map holds digests, never a key, and can
        # be swapped through the runtime API without a reload (door_clients_command).
        "    http-request set-var(txn.client) "
        f"http_auth_bearer,sha2(256),hex,lower,map_str({door_clients_map(cfg)})",
        # /health stays open, as the routers' and SGLang's are: the door's own check of a slot.
        "    http-request return status 401 content-type application/json "
        f"string '{unknown}' hdr WWW-Authenticate Bearer "
        "if !{ var(txn.client) -m found } !{ path /health }",
        f"    http-request track-sc0 var(txn.client) table {CLIENTS_TABLE} "
        "if { var(txn.client) -m found }",
        "    http-request set-header Authorization "
        f"\"Bearer %[str(router),map_str({door_internal_key_map(cfg)})]\"",
        f"    log-format \"{HTTPLOG_FORMAT} client=%[var(txn.client)]\"",
    ]


def container_running(name: str) -> str:
    """A shell test: the container NAME exists and runs."""
    return f"[ \"$(docker inspect -f '{{{{.State.Running}}}}' {name} 2>/dev/null)\" = true ]"


def reload_door_command(cfg: ClusterConfig) -> str:
    """A running door re-reads its files: the slots' states saved first (a reload would forget
    a drain), then SIGUSR2 to the master, which keeps the listening sockets (no connection
    refused) while the old worker finishes its requests. Nothing when the door is not running."""
    door = shell([container_name(DOOR)])
    save = shell(["sh", "-c", f"echo 'show servers state' | socat stdio "
                  f"{door_admin_socket(cfg)} > {door_state_file(cfg)}"])
    return (f"if {container_running(door)}; "
            f"then docker exec {door} {save} && docker kill --signal USR2 {door} >/dev/null; fi")


def write_door_config_command(cfg: ClusterConfig) -> str:
    """stdin (haproxy.cfg) checked by the door image's own haproxy, moved into place, and a
    running door reloaded."""
    directory, target = door_dir(cfg), door_config_file(cfg)
    new = target + ".new"
    check = ["docker", "run", "--rm", "--network", "none", "--entrypoint", HAPROXY,
             "--user", DOOR_USER, "-v", f"{directory}:{directory}:ro", door_spec(cfg).image,
             "-c", "-q", "-f", new]
    return (f"mkdir -p {shell([directory])} && chmod 700 {shell([directory])} && "
            # A state file with its version line only: no state yet (and no warning).
            f"{{ [ -s {shell([door_state_file(cfg)])} ] || echo 1 > "
            f"{shell([door_state_file(cfg)])}; }} && cat > {shell([new])} && "
            f"{shell(check)} && mv {shell([new, target])} && {reload_door_command(cfg)}")


def remove_door_files_command(cfg: ClusterConfig) -> str:
    return f"rm -rf {shell([door_dir(cfg)])}"


def write_door_tls_command(cfg: ClusterConfig) -> str:
    """stdin (certificate chain, then key) into the door's PEM, readable by root only; the CA the
    smoke test verifies against beside it; a running door reloaded."""
    tls = door_spec(cfg).tls
    assert tls is not None
    pem, ca = door_tls_file(cfg), door_ca_file(cfg)
    ca_text = tls.ca_certificate or tls.certificate
    return (f"umask 077 && mkdir -p {shell([door_dir(cfg)])} && cat > {shell([pem + '.new'])} && "
            f"mv {shell([pem + '.new', pem])} && printf '%s\\n' {shell([ca_text.strip()])} > "
            f"{shell([ca])} && {reload_door_command(cfg)}")


def door_plan(cfg: ClusterConfig, address: str | None = None) -> ContainerPlan:
    """The door on ADDRESS (unset: router.node): the same container, config and directory on
    either door node; its role names the node unless it is router.node's."""
    node = address or cfg.router.node
    role = cfg.door_role(node)
    plan = container_plan(cfg, role, node,
                          ["-W", "-db", "-f", door_config_file(cfg), "-x", door_admin_socket(cfg)],
                          {},
                          door_health_url(cfg, node), gpu_workload=False)
    # Only its own directory; no restart generation either: only a change of the door itself
    # (its image) replaces it, through the bridge (door_bridge_command; docs/door.md).
    # -x: the listening sockets of whatever serves router.port on the node (the bridge, or a
    # door that still runs); with nobody there HAProxy says so and binds them itself.
    # SIGUSR1: HAProxy's soft stop (refuse new connections, finish the open ones); docker's
    # SIGTERM would cut every stream at once.
    # Named kimipd-door on every door node: the config command reloads it by that name.
    return dataclasses.replace(plan, name=container_name(DOOR), labels={"kimipd.role": role},
                               mounts=[(door_dir(cfg), door_dir(cfg), False)],
                               entrypoint=[HAPROXY], ulimits={}, stop_signal="SIGUSR1",
                               user=DOOR_USER)


DOOR_BRIDGE = "door-bridge"
# How long the bridge may take to load and take the sockets over; an image that cannot is
# refused here, before the serving door is touched.
BRIDGE_START_SECONDS = 30


def door_bridge_command(cfg: ClusterConfig, image: str) -> str:
    """Before a new door image replaces the door's container: the bridge, a HAProxy of the new
    image with the same files, takes the listening sockets over from the running door (-x), so
    the old door's soft stop and the new door's start refuse no connection (docs/door.md).
    Nothing when no door runs (the first `up`, a dead door): there is nothing to hand over.

    The slots' states are saved first (the bridge and the new door load them: a drain
    survives). The bridge removes itself once its soft stop ends (--rm); a bridge still
    finishing its streams from an earlier change is waited for, at most a stream's time."""
    bridge, door = container_name(DOOR_BRIDGE), container_name(DOOR)
    directory = door_dir(cfg)
    plan = door_plan(cfg)
    run = ["docker", "run", "-d", "--rm", "--name", bridge, "--network", "host",
           "--ipc", "host", "--user", DOOR_USER, "--stop-signal", "SIGUSR1",
           "--label", f"kimipd.bridge={DOOR}", "-v", f"{directory}:{directory}",
           "--entrypoint", HAPROXY, image, *plan.command]
    save = shell(["sh", "-c", f"echo 'show servers state' | socat stdio "
                  f"{door_admin_socket(cfg)} > {door_state_file(cfg)}"])
    grace = cfg.router.drain_timeout_seconds + 5
    return "\n".join([
        "set -eu",
        f"if ! {container_running(door)}; "
        "then echo 'no door runs: nothing to hand over'; exit 0; fi",
        f"if docker inspect {bridge} >/dev/null 2>&1; then",
        f"  timeout {grace} docker wait {bridge} >/dev/null 2>&1 || true",
        f"  docker rm -f {bridge} >/dev/null 2>&1 || true",
        "fi",
        f"docker exec {door} {save}",
        f"{shell(run)} >/dev/null",
        f"for _ in $(seq {BRIDGE_START_SECONDS * 2}); do",
        # Loaded without the running door's sockets, it would have bound its own beside them,
        # and the old door's soft stop would reset what waits in its accept queue.
        f"  if docker logs {bridge} 2>&1 | grep -q 'Failed to get the sockets'; then break; fi",
        f"  if docker logs {bridge} 2>&1 | grep -q 'Loading success'; then",
        "    echo 'the bridge holds the listening sockets'; exit 0",
        "  fi",
        f"  if ! {container_running(bridge)}; then break; fi",
        "  sleep 0.5",
        "done",
        f"docker logs --tail 20 {bridge} >&2 2>&1 || true",
        f"docker rm -f {bridge} >/dev/null 2>&1 || true",
        f"echo 'the door bridge ({image}) did not take the listening sockets over from {door} "
        f"within {BRIDGE_START_SECONDS} s (its log above); the serving door is left as it was' "
        ">&2",
        "exit 1",
    ])


def door_bridge_retire_command() -> str:
    """Once the new door has loaded (it took the sockets from the bridge): the bridge's soft
    stop; it finishes its open streams and removes itself (--rm). A new door that has not
    loaded leaves the bridge serving, and fails here."""
    bridge, door = container_name(DOOR_BRIDGE), container_name(DOOR)
    return "\n".join([
        f"if ! {container_running(bridge)}; then echo 'no bridge'; exit 0; fi",
        f"if {container_running(door)} && "
        f"docker logs {door} 2>&1 | grep -q 'Loading success'; then",
        f"  docker kill --signal USR1 {bridge} >/dev/null && echo 'the bridge stops softly'",
        "else",
        f"  echo 'the new door has not loaded: {bridge} goes on serving' >&2; exit 1",
        "fi",
    ])
