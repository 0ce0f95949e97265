"""The door (HAProxy in front of two router slots), as rendered from the model."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys

import pytest

from components.config import ConfigError, load_cluster_config
from components.render import (door_bridge_command, door_bridge_retire_command,
                               door_clients_command, door_clients_map_text,
                               door_haproxy_config, door_plan, drain_command, firewall_ruleset,
                               router_command, router_plan, router_url, slot_admit_command,
                               slot_drain_command, smoke_test_command)
from components.render.door import SWAP_MAPS_SCRIPT
from tests.conftest import REPO, stack_values

CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
DOOR_IMAGE = "registry.example/kimipd/door@sha256:" + "a" * 64


@pytest.fixture
def pro6000(pro6000: dict) -> dict:
    """pro6000 with the door."""
    pro6000["router"]["door"] = {"image": DOOR_IMAGE}
    return pro6000


def config(pro6000: dict, **door):
    values = copy.deepcopy(pro6000)
    values["router"]["door"] = {**values["router"]["door"], **door}
    return load_cluster_config(values)


def test_the_door_owns_router_port_and_each_slot_has_its_own_ports(pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    haproxy = door_haproxy_config(cfg).splitlines()
    assert "    bind 0.0.0.0:31000" in haproxy
    # Each slot's pair check beside its router (a healthy prefill and decode of one contract),
    # not smg's /readiness, which ignores pairing, nor its liveness.
    assert "    server slot-a 127.0.0.1:31001 check port 31101" in haproxy
    assert "    server slot-b 127.0.0.1:31002 check port 31102" in haproxy
    assert "    option httpchk GET /pairs" in haproxy
    launch = router_plan(cfg, "b").command
    assert launch[launch.index("--pair-check-port") + 1] == "31102"
    argv = router_command(cfg, "b")
    assert argv[argv.index("--port") + 1] == "31002"
    assert argv[argv.index("--prometheus-port") + 1] == "29002"
    assert router_plan(cfg, "a").name == "kimipd-router-a"
    assert router_url(cfg) == "http://174.1.60.5:31000"
    assert cfg.roles_of("174.1.60.5")[-3:] == ["door", "router-a", "router-b"]


def test_only_a_refused_connection_is_retried_on_the_other_slot(pro6000: dict) -> None:
    lines = [line.strip() for line in door_haproxy_config(load_cluster_config(pro6000))
             .splitlines()]
    # A request that reached a router is never replayed (a PD dispatch is not idempotent).
    assert [line for line in lines if line.startswith("retry-on")] == ["retry-on conn-failure"]
    assert "option redispatch 1" in lines
    assert not [line for line in lines if "http-buffer-request" in line or "redispatch" in line
                and line != "option redispatch 1"]


def test_the_door_survives_restart_generation_and_stops_softly(pro6000: dict) -> None:
    plan = door_plan(load_cluster_config(pro6000))
    # Its labels carry no restart generation: a bump rolls the slots behind it, not the door.
    assert plan.labels == {"kimipd.role": "door"}
    assert plan.stop_signal == "SIGUSR1"
    # haproxy from the image's PATH, as root: the official image's is /usr/local/sbin/haproxy
    # and its user uid 99, Debian's package /usr/sbin/haproxy.
    assert (plan.entrypoint, plan.user) == (["haproxy"], "0:0")
    assert plan.mounts == [("/opt/kimipd/router-31000/door", "/opt/kimipd/router-31000/door",
                            False)]


def test_pro6000_as_shipped_serves_through_the_door() -> None:
    """The shipped stack file, untouched: HAProxy owns router.port on both door nodes, two slots
    serve behind it (b on the other door node), from the official image pinned by digest."""
    cfg = load_cluster_config(stack_values("pro6000"))
    door = cfg.router.door
    assert door is not None and door.image.startswith("haproxy@sha256:")
    assert cfg.door_nodes == ["174.1.60.5", "174.1.60.7"]
    config = door_haproxy_config(cfg).splitlines()
    assert "    bind 0.0.0.0:31000" in config
    assert [line.split()[1:3] for line in config if line.startswith("    server ")] == [
        ["slot-a", "174.1.60.5:31001"], ["slot-b", "174.1.60.7:31002"]]


def test_minilb_slots_are_checked_on_health(pro6000: dict) -> None:
    values = copy.deepcopy(pro6000)
    values["router"] = {"node": "174.1.60.5", "kind": "mini-lb", "door": values["router"]["door"]}
    cfg = load_cluster_config(values)
    assert "    option httpchk GET /health" in door_haproxy_config(cfg).splitlines()
    assert "--mini-lb" in slot_admit_command(cfg, "a")


def test_every_group_drain_talks_to_both_slots(pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    drain = drain_command(cfg, "prefill")
    assert ("--router http://127.0.0.1:31001 --slot slot-a --router http://127.0.0.1:31002 "
            "--slot slot-b --door-socket /opt/kimipd/router-31000/door/admin.sock") in drain
    slot = slot_drain_command(cfg, "a")
    assert "--slot a --other b --door-socket /opt/kimipd/router-31000/door/admin.sock" in slot


def test_slot_ports_are_members_only_and_the_door_and_exporter_are_not(pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    rules = firewall_ruleset(cfg, "174.1.60.5")
    assert "tcp dport 31000 accept" in rules
    assert "31001" not in rules and "31002" not in rules
    # The exporter and the slots' metrics are metrics ports (firewall.monitoringHosts).
    assert cfg.metrics_ports_on("174.1.60.5") == [29001, 29002, 29100, 30000]


def test_a_slot_port_that_collides_is_refused_by_its_key(pro6000: dict) -> None:
    with pytest.raises(ConfigError) as refused:
        config(pro6000, slots=[{"port": 31000, "metricsPort": 29001},
                               {"port": 31002, "metricsPort": 29002}])
    assert "router.door.slots[0].port: 31000 on 174.1.60.5 is already used by router.port" \
        in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        config(pro6000, slots=[{"port": 31001, "metricsPort": 29001}])
    assert "router.door.slots" in str(refused.value)


def test_tls_serves_https_and_the_smoke_test_verifies_it(pro6000: dict) -> None:
    cfg = config(pro6000, tls={"certificate": CERT})
    assert router_url(cfg) == "https://174.1.60.5:31000"
    assert ("    bind 0.0.0.0:31000 ssl crt /opt/kimipd/router-31000/door/tls.pem "
            "alpn http/1.1") in door_haproxy_config(cfg).splitlines()
    assert "--cacert /opt/kimipd/router-31000/door/ca.pem" in smoke_test_command(cfg)
    with pytest.raises(ConfigError) as refused:
        config(pro6000, tls={"certificate": "not a certificate"})
    assert "router.door.tls.certificate" in str(refused.value)
    assert "not a PEM certificate" in str(refused.value)


def test_door_slots_parses_the_doors_show_stat() -> None:
    """The runtime API's `show stat` CSV (HAProxy 2.6.12, as the door image's answered)."""
    script = REPO / "assets" / "door-slots.py"
    code = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(script.parent)!r})\n"
        f"spec = importlib.util.spec_from_file_location('members', {str(script)!r})\n"
        "members = importlib.util.module_from_spec(spec); spec.loader.exec_module(members)\n"
        "door = members.Door('/nonexistent')\n"
        "door.ask = lambda line: ('# pxname,svname,qcur,qmax,scur,smax,status,\\n'\n"
        "  'door,FRONTEND,,,3,9,OPEN,\\n'\n"
        "  'slots,slot-a,0,0,2,4,DRAIN,\\n'\n"
        "  'slots,slot-b,1,1,5,5,UP 1/2,\\n'\n"
        "  'slots,BACKEND,0,0,7,9,UP,\\n')\n"
        "rows = door.servers()\n"
        "print(sorted(rows), rows['slot-a']['status'], rows['slot-b']['scur'],\n"
        "      members.mine_serves('UP 1/2'), members.mine_serves('DOWN'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["['slot-a',", "'slot-b']", "DRAIN", "5", "True", "False"]


def test_haproxy_accepts_the_rendered_configuration(pro6000: dict, tmp_path) -> None:
    """Debian's haproxy 2.6 (the door image's) checks what the door would run, TLS included."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed (scripts/test installs Debian's package)")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=174.1.60.5", "-addext", "subjectAltName=IP:174.1.60.5",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    cert = (tmp_path / "cert.pem").read_text()
    for cfg in (load_cluster_config(pro6000), config(pro6000, tls={"certificate": cert})):
        (tmp_path / "tls.pem").write_text(cert + (tmp_path / "key.pem").read_text())
        rendered = door_haproxy_config(cfg).replace("/opt/kimipd/router-31000/door",
                                                    str(tmp_path))
        (tmp_path / "haproxy.cfg").write_text(rendered)
        (tmp_path / "servers.state").write_text("1\n")  # as the config command leaves it
        result = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "haproxy.cfg")],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr


# A stand-in for docker on the node: answers `inspect` from DOCKER_RUNNING (the containers that
# run), `logs` from DOCKER_LOGS, and records every call in DOCKER_CALLS.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$DOCKER_CALLS"
case "$1" in
  inspect) name=$(eval echo "\\${$#}")
           case " $DOCKER_RUNNING " in *" $name "*) echo true ;; *) exit 1 ;; esac ;;
  logs) printf '%s\\n' "$DOCKER_LOGS" ;;
esac
exit 0
"""


def run_on_fake_node(script: str, tmp_path, running: str, logs: str):
    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir(exist_ok=True)
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {"PATH": f"{docker.parent}:/usr/bin:/bin", "DOCKER_CALLS": str(calls),
           "DOCKER_RUNNING": running, "DOCKER_LOGS": logs}
    result = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                            timeout=60)
    return result, calls.read_text().splitlines()


def test_a_new_door_takes_the_listening_sockets_from_the_one_before(pro6000: dict) -> None:
    cfg = load_cluster_config(pro6000)
    assert door_plan(cfg).command[-2:] == ["-x", "/opt/kimipd/router-31000/door/admin.sock"]
    assert ("stats socket /opt/kimipd/router-31000/door/admin.sock mode 600 level admin "
            "expose-fd listeners") in door_haproxy_config(cfg)


def test_the_bridge_runs_the_new_image_only_while_a_door_serves(pro6000: dict, tmp_path) -> None:
    cfg = load_cluster_config(pro6000)
    new = "registry.example/kimipd/door@sha256:" + "b" * 64
    script = door_bridge_command(cfg, new)
    # No door: nothing to hand over, nothing started.
    result, calls = run_on_fake_node(script, tmp_path, running="", logs="")
    assert result.returncode == 0 and "nothing to hand over" in result.stdout, result
    assert not any(call.startswith("run ") for call in calls), calls
    # A door: its slots' states saved, then the new image with the door's own arguments.
    result, calls = run_on_fake_node(script, tmp_path, running="kimipd-door",
                                     logs="[NOTICE] Loading success.")
    assert result.returncode == 0, result
    (run,) = [call for call in calls if call.startswith("run ")]
    assert run.endswith(f"--entrypoint haproxy {new} " + " ".join(door_plan(cfg).command))
    assert "--name kimipd-door-bridge" in run and "--rm" in run
    assert calls.index(next(c for c in calls if c.startswith("exec kimipd-door "))) \
        < calls.index(run)


def test_a_bridge_without_the_sockets_is_removed_and_the_door_left_serving(
        pro6000: dict, tmp_path) -> None:
    cfg = load_cluster_config(pro6000)
    script = door_bridge_command(cfg, DOOR_IMAGE)
    result, calls = run_on_fake_node(
        script, tmp_path, running="kimipd-door kimipd-door-bridge",
        logs="[ALERT] Failed to get the sockets from the old process!")
    assert result.returncode == 1
    assert "did not take the listening sockets over from kimipd-door" in result.stderr
    assert "rm -f kimipd-door-bridge" in calls
    assert not any("kimipd-door " in call and call.startswith(("rm", "kill", "stop"))
                   for call in calls), calls


def test_the_bridge_stops_only_once_the_new_door_has_loaded(tmp_path) -> None:
    script = door_bridge_retire_command()
    result, calls = run_on_fake_node(script, tmp_path, running="kimipd-door kimipd-door-bridge",
                                     logs="[NOTICE] Loading success.")
    assert result.returncode == 0 and "kill --signal USR1 kimipd-door-bridge" in calls
    result, calls = run_on_fake_node(script, tmp_path, running="kimipd-door-bridge", logs="")
    assert result.returncode == 1 and "goes on serving" in result.stderr
    assert not any(call.startswith("kill") for call in calls), calls


def test_the_bridge_scripts_are_shellcheck_clean(pro6000: dict, tmp_path) -> None:
    assert shutil.which("shellcheck"), "shellcheck is missing: .ci/run installs it"
    cfg = load_cluster_config(pro6000)
    for name, script in {"bridge": door_bridge_command(cfg, DOOR_IMAGE),
                         "retire": door_bridge_retire_command()}.items():
        path = tmp_path / f"{name}.sh"
        path.write_text("#!/bin/sh\n" + script + "\n")
        result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


ALICE_DIGEST = "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90"


def test_client_keys_are_checked_at_the_door_and_swapped_for_the_internal_key(
        pro6000: dict) -> None:
    rendered = door_haproxy_config(config(pro6000, clientKeys={"alice": ALICE_DIGEST}))
    assert ("http-request set-var(txn.client) http_auth_bearer,sha2(256),hex,lower,"
            "map_str(/opt/kimipd/router-31000/door/clients.map)") in rendered
    assert "if !{ var(txn.client) -m found } !{ path /health }" in rendered
    assert ('http-request set-header Authorization "Bearer %[str(router),'
            'map_str(/opt/kimipd/router-31000/door/internal-key.map)]"') in rendered
    assert "option httplog" not in rendered and "client=%[var(txn.client)]" in rendered
    # Without client keys the client's own header goes through, as before.
    plain = door_haproxy_config(load_cluster_config(pro6000))
    assert "txn.client" not in plain and "option httplog" in plain


def test_the_clients_map_holds_digests_and_names_the_program_first(pro6000: dict) -> None:
    cfg = config(pro6000, clientKeys={"alice": ALICE_DIGEST})
    assert door_clients_map_text(cfg, "f" * 64) == f"{'f' * 64} kimipd\n{ALICE_DIGEST} alice\n"


@pytest.mark.parametrize(("keys", "named"), [
    ({"alice": "not-a-digest"}, "is not a sha256 in hex"),
    ({"alice": ALICE_DIGEST.upper()}, "is not a sha256 in hex"),
    ({"Alice Smith": ALICE_DIGEST}, "client name 'Alice Smith'"),
    ({"kimipd": ALICE_DIGEST}, "client name 'kimipd'"),
])
def test_a_bad_client_key_is_refused_by_its_key(pro6000: dict, keys: dict, named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        config(pro6000, clientKeys=keys)
    assert "clientKeys" in str(refused.value) and named in str(refused.value)
    assert ALICE_DIGEST[16:] not in str(refused.value)  # a digest is named by its start only


def test_client_keys_need_the_rust_router(pro6000: dict) -> None:
    values = copy.deepcopy(pro6000)
    values["router"] |= {"kind": "mini-lb"}
    values["router"]["door"]["clientKeys"] = {"alice": ALICE_DIGEST}
    for key in ("prefillPolicy", "decodePolicy", "metricsPort", "requestTimeoutSeconds"):
        values["router"].pop(key, None)
    with pytest.raises(ConfigError) as refused:
        load_cluster_config(values)
    assert "router.door.clientKeys: alice set with router.kind 'mini-lb'" in str(refused.value)


def test_haproxy_accepts_the_door_with_client_keys(pro6000: dict, tmp_path) -> None:
    haproxy = shutil.which("haproxy")
    assert haproxy, "haproxy is missing: .ci/run installs it"
    cfg = config(pro6000, clientKeys={"alice": ALICE_DIGEST})
    rendered = door_haproxy_config(cfg).replace("/opt/kimipd/router-31000/door", str(tmp_path))
    (tmp_path / "haproxy.cfg").write_text(rendered)
    (tmp_path / "servers.state").write_text("1\n")
    (tmp_path / "clients.map").write_text(door_clients_map_text(cfg, "f" * 64))
    (tmp_path / "internal-key.map").write_text("router KEY\n")
    result = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "haproxy.cfg")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_clients_command_is_shellcheck_clean(pro6000: dict, tmp_path) -> None:
    assert shutil.which("shellcheck"), "shellcheck is missing: .ci/run installs it"
    cfg = config(pro6000, clientKeys={"alice": ALICE_DIGEST})
    path = tmp_path / "clients.sh"
    path.write_text("#!/bin/sh\n" + door_clients_command(cfg) + "\n")
    result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    swap = tmp_path / "swap.sh"
    swap.write_text("#!/bin/sh\n" + SWAP_MAPS_SCRIPT + "\n")
    result = subprocess.run(["shellcheck", str(swap)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
