"""The door on two nodes: its virtual IP in the model, and keepalived's configuration."""

from __future__ import annotations

import copy
import http.server
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from components.config import (ConfigError, config_warnings, load_cluster_config,
                               placeholder_refusals)
from components.config.placeholders import KEEPALIVED_IMAGE_PLACEHOLDER
from components.render.keepalived import (advert_interval, door_check_file, keepalived_config,
                                          keepalived_config_file, keepalived_plan,
                                          keepalived_state_file)
from tests import fake_servers

VIP = "174.1.60.100"
KEEPALIVED_IMAGE = "registry.example/kimipd/keepalived@sha256:" + "b" * 64


@pytest.fixture
def pro6000(pro6000: dict) -> dict:
    """pro6000 with the door on its router node (174.1.60.5) and 174.1.60.6."""
    pro6000["router"]["door"] |= {"nodes": ["174.1.60.5", "174.1.60.6"],
                                  "virtualIp": {"image": KEEPALIVED_IMAGE, "address": VIP}}
    return pro6000


def refusal(values: dict, **door) -> str:
    values = copy.deepcopy(values)
    if "virtualIp" in door:
        door["virtualIp"] = {"image": KEEPALIVED_IMAGE} | door["virtualIp"]
    values["router"]["door"] |= door
    with pytest.raises(ConfigError) as refused:
        load_cluster_config(values)
    return str(refused.value)


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def test_the_door_stands_on_two_nodes_each_the_others_only_peer(pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    assert cfg.door_nodes == ["174.1.60.5", "174.1.60.6"]
    assert cfg.door_peer("174.1.60.5") == "174.1.60.6"
    assert cfg.door_peer("174.1.60.6") == "174.1.60.5"
    assert cfg.door_peer("174.1.60.1") is None
    vip = cfg.router.door.virtual_ip if cfg.router.door else None
    assert vip is not None
    # The defaults: sub-second adverts, the compute interface, a /32 that adds no route.
    assert (vip.advert_interval_ms, vip.interface, vip.prefix_length, vip.vrid) == (
        100, None, 32, 51)


def test_one_door_node_is_as_before(pro6000: dict) -> None:
    pro6000["router"]["door"] = {key: value for key, value in pro6000["router"]["door"].items()
                                 if key not in ("nodes", "virtualIp")}
    cfg = load_cluster_config(pro6000)
    assert cfg.door_nodes == ["174.1.60.5"]
    assert cfg.door_peer("174.1.60.5") is None
    with pytest.raises(ValueError, match="router.door.virtualIp is not set"):
        keepalived_config(cfg, "174.1.60.5")


def test_nodes_and_virtual_ip_come_together(pro6000: dict) -> None:
    alone = copy.deepcopy(pro6000)
    del alone["router"]["door"]["virtualIp"]
    assert ("router.door.nodes: ['174.1.60.5', '174.1.60.6'] puts the door on two nodes, but "
            "router.door.virtualIp is not set") in refusal(alone)
    alone = copy.deepcopy(pro6000)
    del alone["router"]["door"]["nodes"]
    assert ("router.door.virtualIp: '174.1.60.100' is set but router.door.nodes is not"
            in refusal(alone))
    assert "router.door.nodes: ['174.1.60.5'] has 1 item(s)" in refusal(
        pro6000, nodes=["174.1.60.5"])


def test_door_nodes_are_two_members_one_of_them_the_router_node(pro6000: dict) -> None:
    message = refusal(pro6000, nodes=["174.1.60.5", "174.1.60.9"])
    assert ("router.door.nodes[1]: '174.1.60.9' is not a declared node; add it to `nodes` or "
            "use one of 174.1.60.1,") in message
    message = refusal(pro6000, nodes=["174.1.60.5", "174.1.60.5"])
    assert "router.door.nodes[1]: '174.1.60.5' is router.door.nodes[0] too" in message
    message = refusal(pro6000, nodes=["174.1.60.6", "174.1.60.7"])
    assert ("router.door.nodes: ['174.1.60.6', '174.1.60.7'] leaves out router.node "
            "'174.1.60.5'") in message
    assert "e.g. [174.1.60.5, 174.1.60.6]" in message


def test_the_virtual_ip_is_no_nodes_own_and_on_the_door_nodes_network(pro6000: dict) -> None:
    message = refusal(pro6000, virtualIp={"address": "174.1.60.3"})
    assert "router.door.virtualIp.address: '174.1.60.3' is nodes[2]'s own address" in message
    assert "pick a free address on the door nodes' network" in message
    message = refusal(pro6000, virtualIp={"address": "174.1.61.100", "prefixLength": 24})
    assert ("router.door.virtualIp.prefixLength: 24 puts 174.1.61.100 in 174.1.61.0/24, which "
            "does not hold router.door.nodes[0] '174.1.60.5'") in message
    message = refusal(pro6000, virtualIp={"address": "174.1.60.255", "prefixLength": 24})
    assert "'174.1.60.255' is the network or broadcast address of 174.1.60.0/24" in message
    # Inside the nodes' network with its mask: accepted.
    pro6000["router"]["door"]["virtualIp"] |= {"prefixLength": 24}
    load_cluster_config(pro6000)


def test_a_virtual_ip_value_keepalived_would_refuse_is_refused_by_its_key(pro6000: dict) -> None:
    message = refusal(pro6000, virtualIp={"address": "door.example"})
    assert ("router.door.virtualIp.address: 'door.example' is not an IPv4 address; write a free "
            "address on the door nodes' network, e.g. 174.1.60.100") in message
    message = refusal(pro6000, virtualIp={"address": VIP, "advertIntervalMs": 105})
    assert ("router.door.virtualIp.advertIntervalMs: 105 ms is not a whole number of "
            "centiseconds, the unit VRRPv3 carries; write 100") in message
    message = refusal(pro6000, virtualIp={"address": VIP, "interface": "bond1:0"})
    assert "router.door.virtualIp.interface: 'bond1:0' is not a network interface name" in message
    message = refusal(pro6000, virtualIp={"address": VIP, "vrid": 256})
    assert "router.door.virtualIp.vrid: 256" in message
    message = refusal(pro6000, virtualIp={"address": VIP, "advertInterval": 100})
    assert "router.door.virtualIp.advertInterval: unknown key" in message


def test_the_shipped_stacks_stand_the_door_on_two_nodes() -> None:
    from tests.conftest import stack_values

    pro6000 = load_cluster_config(stack_values("pro6000"))
    assert pro6000.door_nodes == ["174.1.60.5", "174.1.60.7"]
    assert pro6000.router.door is not None and pro6000.router.door.virtual_ip is not None
    assert pro6000.router.door.virtual_ip.address == VIP
    sim = load_cluster_config(stack_values("sim-2p2d"))
    assert sim.door_nodes == ["10.231.60.5", "10.231.60.7"]
    # router.node and decode-b's rank 0: each door node carries a different decode group.
    assert [sim.groups[name].nodes[0] for name in ("decode-a", "decode-b")] == sim.door_nodes
    assert sim.router.door is not None and sim.router.door.virtual_ip is not None
    assert sim.router.door.virtual_ip.address == "10.231.60.100"
    assert sim.router.door.virtual_ip.image == "10.231.60.254:5000/kimipd/sim-keepalived:latest"


def test_pro6000_s_keepalived_image_is_a_placeholder_the_program_refuses() -> None:
    """The model loads it (every stack file is checked as shipped); the program refuses it by
    its key, its value and the fix before any resource."""
    from tests.conftest import stack_values

    values = stack_values("pro6000")
    assert values["router"]["door"]["virtualIp"]["image"] == KEEPALIVED_IMAGE_PLACEHOLDER
    (message,) = placeholder_refusals(load_cluster_config(values), "pro6000")
    assert message == (
        f"router.door.virtualIp.image: {KEEPALIVED_IMAGE_PLACEHOLDER!r} is a placeholder (there "
        "is no official keepalived image); build one into your registry with "
        "`scripts/build-keepalived-image REGISTRY/kimipd/keepalived` (Debian 12's keepalived "
        "and bash) and set the REPO@DIGEST it prints: pulumi config set --path "
        "router.door.virtualIp.image REF -s pro6000")
    # Any image in .invalid is one (it never resolves), with or without a port or digest.
    for image in ("registry.invalid:5000/keepalived@sha256:" + "c" * 64, "x.invalid/k:1"):
        values["router"]["door"]["virtualIp"]["image"] = image
        assert len(placeholder_refusals(load_cluster_config(values), "s")) == 1, image
    values["router"]["door"]["virtualIp"]["image"] = KEEPALIVED_IMAGE
    assert placeholder_refusals(load_cluster_config(values), "pro6000") == []
    assert placeholder_refusals(load_cluster_config(stack_values("sim-2p2d")), "sim-2p2d") == []


def test_without_the_firewall_vrrp_from_anyone_is_warned_about(pro6000: dict) -> None:
    assert not [w for w in config_warnings(load_cluster_config(pro6000)) if "VRRP from anyone" in w]
    pro6000["firewall"] = {"enabled": False}
    warned = [w for w in config_warnings(load_cluster_config(pro6000)) if "VRRP from anyone" in w]
    assert warned == [
        "firewall.enabled: false lets VRRP from anyone reach keepalived on 174.1.60.5 and "
        "174.1.60.6, and VRRPv3 has no authentication: check_unicast_src refuses a stranger's "
        "adverts, but while they came the backup took router.door.virtualIp and gave it back "
        "several times a second (docs/vrrp-trial.md). Remove the key, or drop IP protocol 112 "
        "from anyone but the two door nodes in the nodes' own firewall."]


def test_advert_interval_is_written_in_seconds() -> None:
    assert [advert_interval(ms) for ms in (10, 100, 250, 1000, 1500, 40950)] == [
        "0.01", "0.1", "0.25", "1", "1.5", "40.95"]


def test_keepalived_speaks_unicast_to_the_other_door_node_and_never_preempts(
        pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    router_node = lines(keepalived_config(cfg, "174.1.60.5"))
    other = lines(keepalived_config(cfg, "174.1.60.6"))
    for mine, peer, conf in (("174.1.60.5", "174.1.60.6", router_node),
                             ("174.1.60.6", "174.1.60.5", other)):
        start = conf.index("vrrp_instance door {")
        instance = conf[start:conf.index("}", conf.index("track_file {", start)) + 2]
        assert instance[:3] == ["vrrp_instance door {", "state BACKUP", "nopreempt"]
        assert f"unicast_src_ip {mine}" in instance
        assert instance[instance.index("unicast_peer {") + 1] == peer
        assert "check_unicast_src" in instance
        assert f"{VIP}/32 dev bond1" in instance
        assert "advert_int 0.1" in instance and "virtual_router_id 51" in instance
        assert "vrrp_version 3" in conf
        # No authentication block: VRRPv3 has none; the firewall guards the address.
        assert not [line for line in conf if line.startswith(("authentication", "auth_"))]
        assert f"accepts VRRP from {peer} only, and check_unicast_src refuses any other " \
               "source." in " ".join(conf)
    # The first election, when both start together, goes to router.node; nopreempt keeps it
    # wherever it is afterwards.
    assert "priority 150" in router_node and "priority 100" in other


def test_the_doors_health_puts_the_instance_in_fault(pro6000: dict) -> None:
    """A track file at weight 0: anything but 0 is FAULT, which gives the address up at once
    (a lower priority would not move it: a nopreempt backup does not take over from a master
    of lower priority). Down until the check loop has written it."""
    cfg = load_cluster_config(pro6000)
    conf = lines(keepalived_config(cfg, "174.1.60.6"))
    start = conf.index("track_file door_down {")
    assert conf[start + 1:start + 5] == [
        f'file "{door_check_file(cfg)}"', "weight 0",
        "# Down until the check loop has seen the door answer: a node without one never "
        "takes it.", "init_file 1 overwrite"]
    assert door_check_file(cfg) == "/opt/kimipd/router-31000/vip/door-down"
    assert keepalived_config_file(cfg) == "/opt/kimipd/router-31000/vip/keepalived.conf"
    assert conf[conf.index("track_file {") + 1] == "door_down"


def test_each_state_keepalived_enters_is_written_where_status_reads_it(pro6000: dict) -> None:
    """keepalived has no query interface: it writes each transition, in order, to a FIFO whose
    reader (assets/virtual-ip.sh --notify-fifo, run by bash, since the copied asset need not be
    executable) writes the new state to a file in the directory the container mounts
    read-write; `kimipd status` reads it over SSH. Not a `notify` script: those run
    concurrently, and after a flap the older state could be written last."""
    cfg = load_cluster_config(pro6000)
    assert keepalived_state_file(cfg) == "/opt/kimipd/router-31000/vip/state"
    for address in cfg.door_nodes:
        conf = lines(keepalived_config(cfg, address))
        start = conf.index("vrrp_instance door {")
        global_defs = conf[:start]
        assert "vrrp_notify_fifo /opt/kimipd/router-31000/vip/notify.fifo" in global_defs
        assert ('vrrp_notify_fifo_script "/bin/bash /opt/kimipd/virtual-ip.sh --notify-fifo '
                '/opt/kimipd/router-31000/vip/state"') in global_defs
        assert not any(line.startswith("notify") for line in conf[start:])
        # As root, which keepalived is in its container: the image has no keepalived_script;
        # and script security on, without which `keepalived -t` refuses any script.
        assert "script_user root" in global_defs and "enable_script_security" in global_defs
        plan = keepalived_plan(cfg, address)
        assert ("/opt/kimipd/router-31000/vip", "/opt/kimipd/router-31000/vip", False) in \
            plan.mounts


def test_interface_and_mask_as_configured(pro6000: dict) -> None:
    pro6000["router"]["door"]["virtualIp"] |= {"interface": "eth2", "prefixLength": 24,
                                               "vrid": 7, "advertIntervalMs": 250}
    conf = lines(keepalived_config(load_cluster_config(pro6000), "174.1.60.5"))
    assert "interface eth2" in conf and f"{VIP}/24 dev eth2" in conf
    assert "virtual_router_id 7" in conf and "advert_int 0.25" in conf
    pro6000["network"] = {"computeInterface": "ens1f0"}
    pro6000["router"]["door"]["virtualIp"] = {"image": KEEPALIVED_IMAGE, "address": VIP}
    assert "interface ens1f0" in lines(keepalived_config(load_cluster_config(pro6000),
                                                         "174.1.60.5"))


def _an_interface_here() -> str | None:
    """keepalived -t refuses an interface this machine lacks (bond1 on a test machine)."""
    names = sorted(path.name for path in Path("/sys/class/net").iterdir() if path.name != "lo")
    return names[0] if names else None


@pytest.mark.skipif(shutil.which("keepalived") is None,
                    reason="keepalived (Debian's package) not installed")
def test_keepalived_accepts_every_rendered_config(pro6000: dict, tmp_path: Path) -> None:
    """`keepalived -t` (2.2.7: exit 0, or the first problem and a non-zero exit) parses the
    file as the node's keepalived would; an interface of this machine stands in for bond1."""
    interface = _an_interface_here()
    if interface is None:
        pytest.skip("no network interface but lo here")
    for virtual_ip in ({"address": VIP}, {"address": VIP, "prefixLength": 24, "vrid": 255,
                                          "advertIntervalMs": 10}):
        pro6000["router"]["door"]["virtualIp"] = virtual_ip | {"interface": interface,
                                                               "image": KEEPALIVED_IMAGE}
        cfg = load_cluster_config(pro6000)
        for address in cfg.door_nodes:
            conf = tmp_path / f"keepalived-{address}.conf"
            conf.write_text(keepalived_config(cfg, address))
            check = subprocess.run(["keepalived", "-t", "-f", str(conf)], capture_output=True,
                                   text=True, check=False, timeout=30)
            assert check.returncode == 0, f"{address} {virtual_ip}: {check.stderr}"


def test_a_virtual_ip_needs_a_keepalived_image_docker_can_pull(pro6000: dict) -> None:
    del pro6000["router"]["door"]["virtualIp"]["image"]
    with pytest.raises(ConfigError, match="router.door.virtualIp.image"):
        load_cluster_config(pro6000)
    message = refusal(pro6000, virtualIp={"address": VIP, "image": "Keepalived:"})
    assert "router.door.virtualIp.image: 'Keepalived:' has an empty tag, so docker cannot " \
           "pull it; write REPOSITORY@sha256:DIGEST" in message


def test_keepalived_runs_beside_its_check_loop_on_each_door_node(pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    for address, role in (("174.1.60.5", "keepalived"), ("174.1.60.6", "keepalived-174-1-60-6")):
        plan = keepalived_plan(cfg, address)
        assert (plan.role, plan.node, plan.name, plan.restart) == (
            role, address, "kimipd-keepalived", "no")
        assert plan.command == [
            "/opt/kimipd/virtual-ip.sh", "--config", keepalived_config_file(cfg),
            "--check-file", door_check_file(cfg), "--state-file", keepalived_state_file(cfg),
            "--door", f"{address}:29100",
            "--interval", "0.1"]
        assert plan.capabilities == ["NET_ADMIN", "NET_RAW", "NET_BROADCAST"]
        assert plan.mounts == [("/opt/kimipd", "/opt/kimipd", True),
                               ("/opt/kimipd/router-31000/vip", "/opt/kimipd/router-31000/vip",
                                False)]
        assert plan.health_url == f"http://{VIP}:29100/health"


class _Door:
    """A door's /health on loopback that can stop answering."""

    def __init__(self) -> None:
        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Health)
        self.port = self.server.server_address[1]
        fake_servers.serve(self.server)

    def stop(self) -> None:
        fake_servers.stop(self.server)


def _until(condition, what: str, seconds: float = 30) -> None:
    # Generous: the test machine runs other work beside (load average above 10 at times).
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def fake_keepalived(tmp_path: Path) -> Path:
    """`keepalived` on PATH that records its arguments, its pid and the signals it gets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "keepalived"
    fake.write_text(f"""#!/usr/bin/env bash
trap 'echo term > {tmp_path}/term; exit 0' TERM
trap 'echo hup >> {tmp_path}/hup' HUP
# The pid last: once it is there, a signal is caught, not fatal.
printf "%s\\n" "$*" > {tmp_path}/args; echo $$ > {tmp_path}/pid
while true; do sleep 0.02; done
""")
    fake.chmod(0o755)
    return bin_dir


def _start(tmp_path: Path, bin_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.Popen(
        ["bash", str(Path(__file__).parents[2] / "assets" / "virtual-ip.sh"),
         "--config", str(tmp_path / "keepalived.conf"), "--check-file",
         str(tmp_path / "door-down"), "--state-file", str(tmp_path / "state"),
         "--door", f"127.0.0.1:{port}", "--interval", "0.05"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_default_signals)


def _default_signals() -> None:
    # As in its container: a shell started with SIGHUP ignored (pytest under nohup) could not
    # trap it, and would pass that on to keepalived.
    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


def _end(script: subprocess.Popen) -> None:
    """The script and whatever it started (the fake keepalived, the loop): nothing left over."""
    try:
        os.killpg(script.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    script.wait(timeout=30)


def _catches(pid: int, signum: int) -> bool:
    """Whether PID has a handler for SIGNUM (a trap, for bash): /proc's SigCgt mask."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _check(tmp_path: Path) -> str:
    path = tmp_path / "door-down"
    return path.read_text().strip() if path.exists() else ""


@pytest.mark.timeout(120)
def test_the_check_loop_writes_the_doors_health_at_every_tick(
        tmp_path: Path, fake_keepalived: Path) -> None:
    door = _Door()
    script = _start(tmp_path, fake_keepalived, door.port)
    try:
        _until(lambda: _check(tmp_path) == "0" and (tmp_path / "pid").exists(),
               "door answered: 0")
        assert (tmp_path / "args").read_text().split() == [
            "-n", "-l", "-D", "-f", str(tmp_path / "keepalived.conf")]
        door.stop()
        _until(lambda: _check(tmp_path) == "1",
               f"door gone: 1 (still running: {script.poll() is None})")
        # A new keepalived.conf: the config command's SIGHUP reaches keepalived. The script is
        # not PID 1 here, so a SIGHUP before its trap would end it: wait for the trap.
        _until(lambda: _catches(script.pid, signal.SIGHUP), "the script traps SIGHUP")
        script.send_signal(signal.SIGHUP)
        _until(lambda: (tmp_path / "hup").exists(), "keepalived got SIGHUP")
        assert script.poll() is None
        # docker stop: keepalived gets SIGTERM (it gives the address up), the loop ends too.
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=30) == 0
        assert (tmp_path / "term").exists()
    finally:
        _end(script)
        door.stop()  # again if the test stopped it: a second stop returns at once


@pytest.mark.timeout(120)
def test_a_restarted_container_shows_no_state_of_before_the_restart(
        tmp_path: Path, fake_keepalived: Path) -> None:
    """A container that stopped as MASTER (or was killed) left MASTER in the state file: the new
    run removes it before keepalived starts, so status says unknown, not MASTER, until
    keepalived's first transition writes the state of this run."""
    (tmp_path / "state").write_text("MASTER\n")
    (tmp_path / "state.new").write_text("BACKUP\n")  # a notify cut short
    door = _Door()
    script = _start(tmp_path, fake_keepalived, door.port)
    try:
        _until(lambda: (tmp_path / "pid").exists(), "keepalived started")
        assert not (tmp_path / "state").exists() and not (tmp_path / "state.new").exists()
    finally:
        _end(script)
        door.stop()


def test_the_state_file_is_required(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(Path(__file__).parents[2] / "assets" / "virtual-ip.sh"), "--config", "c",
         "--check-file", "f", "--door", "127.0.0.1:9"], capture_output=True, text=True,
        timeout=30, check=False)
    assert result.returncode == 2
    assert "--config, --check-file, --state-file and --door HOST:PORT are required" in (
        result.stderr)


@pytest.mark.timeout(120)
def test_keepalived_and_the_loop_end_together(tmp_path: Path, fake_keepalived: Path) -> None:
    door = _Door()
    script = _start(tmp_path, fake_keepalived, door.port)
    try:
        _until(lambda: (tmp_path / "pid").exists() and _check(tmp_path) == "0", "started")
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        # The container exits (restart: no), and the loop with it: nothing is left writing 0.
        assert script.wait(timeout=30) == 1
        output = script.stdout.read() if script.stdout else ""
        assert "keepalived ended; stopping the door check" in output
        (tmp_path / "door-down").unlink()
        time.sleep(0.3)
        assert not (tmp_path / "door-down").exists()
    finally:
        door.stop()
        _end(script)


@pytest.mark.timeout(120)
def test_a_door_that_resets_connections_is_down_and_the_loop_lives_on(
        tmp_path: Path, fake_keepalived: Path) -> None:
    """A door going away resets the loop's connection between its connect and its request; the
    write's SIGPIPE must not end the loop (it did: keepalived went down with it)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]

    def reset_every_connection() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=reset_every_connection, daemon=True).start()
    script = _start(tmp_path, fake_keepalived, port)
    try:
        _until(lambda: _check(tmp_path) == "1", "resets: 1")
        time.sleep(2)  # some 40 resets at 0.05 s
        assert script.poll() is None, script.stdout.read() if script.stdout else ""
        assert _check(tmp_path) in ("1", "")
    finally:
        # close() alone leaves the thread's accept() blocked on the socket; shutdown() wakes it.
        try:
            listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        listener.close()
        _end(script)
