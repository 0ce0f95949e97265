"""How `kimipd` reads a stack: the pulumi CLI's outputs and config (a fake `pulumi` here), the
SSH key held in memory, and the wrapper's --help."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from argparse import Namespace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from components.config import VerificationSpec, load_cluster_config
from ops import DEGRADED, DOWN, OK, USAGE
from ops.terminal import progress_line
from ops.remote import RemoteError, SshTransport, load_private_key
from ops.stack import StackError, config_values, load_stack
from ops.topology import Topology
from tests.outputs import complete_outputs
from tests.conftest import REPO, stack_values


def openssh_key() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption()).decode()


PULUMI_CONFIG = {
    "kimipd:connection": {"value": "{\"knownHostsFile\":\"/tmp/kh\"}",
                          "objectValue": {"knownHostsFile": "/tmp/kh"}, "secret": False},
    # set without --path: JSON text, no objectValue
    "kimipd:nodes": {"value": "[{\"address\":\"10.0.0.1\",\"sshUser\":\"ops\",\"sshPort\":2222}]",
                     "secret": False},
    "kimipd:image": {"value": "registry:5000/sglang:kimi-k3", "secret": False},
    "kimipd:restartGeneration": {"value": "3", "secret": False},
    "kimipd:sshPrivateKey": {"secret": True},
}
OUTPUTS = complete_outputs({
    "serving": True, "restartGeneration": 3, "routerUrl": "http://10.0.0.1:31000",
    "generateUrl": "http://10.0.0.1:31000/generate",
    "containers": {"router": {"node": "10.0.0.1", "container": "kimipd-router",
                              "healthUrl": "http://10.0.0.1:31000/health"}},
    "groups": {}, "nodes": {"10.0.0.1": {"roles": ["router"]}}})


@pytest.fixture
def fake_pulumi(tmp_path: Path, monkeypatch) -> Path:
    """A `pulumi` on PATH answering what the Automation API asks to read a stack (version,
    stack ls, stack --stack, stack output, config --show-secrets, stack export), logging its
    argv and working directory."""
    key = openssh_key()
    (tmp_path / "outputs.json").write_text(json.dumps(OUTPUTS))
    (tmp_path / "config.json").write_text(json.dumps(PULUMI_CONFIG))
    (tmp_path / "key").write_text(key)
    (tmp_path / "Pulumi.yaml").write_text("name: kimipd\nruntime: python\n")
    script = tmp_path / "bin" / "pulumi"
    script.parent.mkdir()
    script.write_text(f"""#!/usr/bin/env bash
args="$*"
args="${{args#--non-interactive }}"
printf '%s|%s\\n' "$PWD" "$args" >> {tmp_path}/calls
case "$args" in
  version) echo v3.274.0 ;;
  "stack ls --json") echo '[{{"name": "selected", "current": true}}, {{"name": "other", "current": false}}]' ;;
  "stack --stack "*) ;;
  "stack output --json --stack "*) cat {tmp_path}/outputs.json ;;
  "stack output --json --show-secrets --stack "*) cat {tmp_path}/outputs.json ;;
  "config --show-secrets --json --stack "*) python3 -c '
import json, sys
config = json.load(open("{tmp_path}/config.json"))
key = open("{tmp_path}/key").read()
for name, entry in config.items():
    if entry.get("secret"):
        entry["value"] = key if name.endswith("sshPrivateKey") else "router-key"
print(json.dumps(config))' ;;
  *) echo "unexpected: $args" >&2; exit 3 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def calls(fake_pulumi: Path) -> list[str]:
    return [line.split("|", 1)[1] for line in (fake_pulumi / "calls").read_text().splitlines()
            if line.split("|", 1)[1] != "version"]


def test_reads_outputs_config_and_the_key_through_the_automation_api(fake_pulumi: Path) -> None:
    stack = load_stack("pro6000", cwd=fake_pulumi)
    # In the project directory, each naming its stack; none selects one.
    assert all(line.startswith(f"{fake_pulumi}|")
               for line in (fake_pulumi / "calls").read_text().splitlines()
               if not line.endswith("|version"))
    assert calls(fake_pulumi) == ["stack output --json --stack pro6000",
                                  "stack output --json --show-secrets --stack pro6000",
                                  "config --show-secrets --json --stack pro6000"]
    assert stack.topology.generate_url == "http://10.0.0.1:31000/generate"
    assert stack.topology.restart_generation == 3
    access = stack.access
    assert access.known_hosts_file == "/tmp/kh"
    node = access.node("10.0.0.1")
    assert (node.ssh_user, node.ssh_port) == ("ops", 2222)
    assert access.node("10.0.0.9").ssh_user == "root"  # not in kimipd:nodes: the defaults
    key = (fake_pulumi / "key").read_text()
    assert access.private_key == key
    assert key.strip() not in repr(stack) and "PRIVATE" not in repr(access)
    assert stack.verification == VerificationSpec()  # no kimipd:verification: the runbook's
    load_private_key(access.private_key)  # a key paramiko takes, from memory


def test_without_a_stack_name_the_selected_one_is_read(fake_pulumi: Path) -> None:
    stack = load_stack(None, cwd=fake_pulumi)
    assert stack.topology.stack == "selected"
    assert calls(fake_pulumi)[:2] == ["stack ls --json", "stack output --json --stack selected"]


def test_no_key_secret_means_ssh_agent(fake_pulumi: Path) -> None:
    config = dict(PULUMI_CONFIG)
    del config["kimipd:sshPrivateKey"]
    (fake_pulumi / "config.json").write_text(json.dumps(config))
    stack = load_stack("sim", cwd=fake_pulumi)
    assert stack.access.private_key is None


def test_a_failing_pulumi_is_a_stack_error(fake_pulumi: Path) -> None:
    bin_pulumi = fake_pulumi / "bin" / "pulumi"
    bin_pulumi.write_text("#!/usr/bin/env bash\n[ \"$1\" = version ] && echo v3.274.0 && exit 0\n"
                          "echo 'error: no stack named nope' >&2\nexit 255\n")
    with pytest.raises(StackError, match="no stack named nope"):
        load_stack("nope", cwd=fake_pulumi)


def test_without_the_cli_on_path_it_says_where_to_get_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="the pulumi CLI is not on PATH"):
        load_stack("sim", cwd=tmp_path)


def test_config_values_take_both_shapes() -> None:
    assert config_values(PULUMI_CONFIG) == {
        "connection": {"knownHostsFile": "/tmp/kh"},
        "nodes": [{"address": "10.0.0.1", "sshUser": "ops", "sshPort": 2222}],
        "image": "registry:5000/sglang:kimi-k3", "restartGeneration": 3}
    plain = {"kimipd:connection": {"knownHostsFile": "/x"}, "nodes": [{"address": "10.0.0.2"}]}
    assert config_values(plain) == {"connection": {"knownHostsFile": "/x"},
                                    "nodes": [{"address": "10.0.0.2"}]}


def test_pro6000_carries_the_runbooks_figures() -> None:
    spec = load_cluster_config(stack_values("pro6000")).verification
    shapes = {s.name: s for s in spec.baseline}
    assert [(s.name, s.input_tokens, s.output_tokens) for s in spec.baseline] == [
        ("warmup", 6, 16), ("medium", 1680, 512), ("long", 5280, 256)]
    assert shapes["medium"].max_e2e_seconds == 31.4 and shapes["long"].max_e2e_seconds == 13.0
    assert shapes["long"].min_prefill_tokens_per_second == 112
    assert shapes["medium"].min_decode_tokens_per_second == 26
    assert spec.tolerance == 0.1
    assert [(s.name, s.input_tokens, s.output_tokens) for s in VerificationSpec().baseline] == [
        ("warmup", 6, 16), ("medium", 1680, 512), ("long", 5280, 256)]


def test_topology_is_in_the_runbooks_order() -> None:
    outputs = complete_outputs({
        "containers": {role: {"node": "10.0.0.1", "container": f"kimipd-{role}",
                              "healthUrl": "http://x/health"}
                       for role in ("router", "decode-r1", "decode-r0", "prefill-r0",
                                    "mooncake-master", "prefill-r1")},
        "groups": {"decode": {"mode": "decode", "endpoint": "http://a:30000", "nodes": ["a", "b"]},
                   "prefill": {"mode": "prefill", "endpoint": "http://c:30000",
                               "nodes": ["c", "d"]}},
        "serving": True})
    topology = Topology.from_outputs("s", outputs)
    assert [c.role for c in topology.containers] == [
        "mooncake-master", "prefill-r0", "prefill-r1", "decode-r0", "decode-r1", "router"]
    assert (topology.containers[4].group, topology.containers[4].rank) == ("decode", 1)


def test_keys_paramiko_cannot_use_are_refused_by_name() -> None:
    with pytest.raises(RemoteError, match="not a private key"):
        load_private_key("not a key")
    encrypted = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.BestAvailableEncryption(b"secret")).decode()
    with pytest.raises(RemoteError, match="passphrase-protected"):
        load_private_key(encrypted)


def test_an_unpinned_node_is_refused(tmp_path: Path) -> None:
    """RejectPolicy: nothing is learnt; a missing known_hosts file is said by name."""
    from ops.stack import Access

    transport = SshTransport(Access(known_hosts_file=str(tmp_path / "none"), nodes={}),
                             connect_timeout=1)
    with pytest.raises(RemoteError, match="does not exist on this machine"):
        transport.run("127.0.0.1", "true", timeout=1)


@pytest.mark.parametrize("command", [[], ["status"], ["logs"], ["verify"], ["targets"], ["orphans"]])
def test_help_on_every_subcommand(command: list[str]) -> None:
    result = subprocess.run([str(REPO / "scripts" / "kimipd"), *command, "--help"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "usage: kimipd" in result.stdout and "exit codes: 0" in result.stdout
    assert "--outputs-json" not in result.stdout and "--state-json" not in result.stdout
    if command:
        assert "-s STACK, --stack STACK" in result.stdout


@pytest.mark.parametrize("argv", [["status", "--no-such-flag"], ["no-such-command"], [],
                                  ["logs", "--role"]])
def test_a_wrong_command_line_exits_with_a_code_no_verdict_uses(argv: list[str]) -> None:
    """2 is "down": a typo in a monitoring script must not read as the stack down."""
    result = subprocess.run([str(REPO / "scripts" / "kimipd"), *argv], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == USAGE and USAGE not in (OK, DEGRADED, DOWN), result.stderr
    assert "usage: kimipd" in result.stderr and "error:" in result.stderr


DOOR_NODE = "10.0.0.5"


def door_outputs(tls: bool = False) -> dict:
    """A stack with the door, as the program's outputs say it (docs: the door's interface)."""
    scheme = "https" if tls else "http"
    containers = {role: {"node": DOOR_NODE, "container": f"kimipd-{role}",
                         "healthUrl": f"http://{DOOR_NODE}:{port}/health"}
                  for role, port in (("router-b", 31002), ("door", 29100), ("router-a", 31001))}
    containers |= {role: {"node": "10.0.0.1", "container": f"kimipd-{role}",
                          "healthUrl": "http://10.0.0.1:30000/health"}
                   for role in ("decode-r0", "mooncake-master", "prefill-r0")}
    return complete_outputs({
        "serving": True, "containers": containers,
        "groups": {"decode": {"mode": "decode", "endpoint": "http://10.0.0.1:30001",
                              "nodes": ["10.0.0.1"]},
                   "prefill": {"mode": "prefill", "endpoint": "http://10.0.0.1:30000",
                               "nodes": ["10.0.0.1"]}},
        "routerUrl": f"{scheme}://{DOOR_NODE}:31000",
        "generateUrl": f"{scheme}://{DOOR_NODE}:31000/generate",
        "door": {"url": f"{scheme}://{DOOR_NODE}:31000", "tls": tls, "node": DOOR_NODE,
                 "metricsUrl": f"http://{DOOR_NODE}:29100/metrics",
                 "adminSocket": "/opt/kimipd/router-31000/door/admin.sock",
                 "container": "kimipd-door",
                 "slots": {name: {"url": f"http://{DOOR_NODE}:{port}", "port": port,
                                  "metricsPort": metrics,
                                  "container": f"kimipd-router-{name}", "server": f"slot-{name}",
                                  "role": f"router-{name}"}
                           for name, port, metrics in (("b", 31002, 29002),
                                                       ("a", 31001, 29001))}},
    })


def test_the_door_output_is_read_into_the_topology() -> None:
    topology = Topology.from_outputs("s", door_outputs(tls=True))
    door = topology.door
    assert door is not None
    assert (door.url, door.tls, door.node, door.port, door.container, door.backend) == (
        f"https://{DOOR_NODE}:31000", True, DOOR_NODE, 31000, "kimipd-door", "slots")
    assert door.admin_socket == "/opt/kimipd/router-31000/door/admin.sock"
    assert door.metrics_url == f"http://{DOOR_NODE}:29100/metrics"
    assert [(s.name, s.url, s.role, s.container, s.server, s.metrics_port)
            for s in door.slots] == [
        ("a", f"http://{DOOR_NODE}:31001", "router-a", "kimipd-router-a", "slot-a", 29001),
        ("b", f"http://{DOOR_NODE}:31002", "router-b", "kimipd-router-b", "slot-b", 29002)]
    assert door.slot("b").server == "slot-b" and door.slot("c") is None
    # the door sorts with the routers: first, then the slots behind it
    assert [c.role for c in topology.containers] == [
        "mooncake-master", "prefill-r0", "decode-r0", "door", "router-a", "router-b"]
    assert [(c.role, c.slot, c.is_router) for c in topology.containers[3:]] == [
        ("door", None, False), ("router-a", "a", True), ("router-b", "b", True)]
    # a slot is a router: `router` is the first one (the router's node), `routers` both
    assert topology.router.role == "router-a" and topology.router.node == DOOR_NODE
    assert [r.role for r in topology.routers] == ["router-a", "router-b"]
    assert topology.door_container.name == "kimipd-door"
    # `kimipd logs --role ...`: router is both slots, door the door, router-b one slot
    for selectors, roles in ((["router"], ["router-a", "router-b"]), (["door"], ["door"]),
                             (["router-b"], ["router-b"]),
                             (["door", "router"], ["door", "router-a", "router-b"])):
        assert [ref.role for ref in topology.select(selectors)] == roles


def test_a_stack_without_the_door_has_its_single_router() -> None:
    topology = Topology.from_outputs("s", OUTPUTS)
    assert topology.door is None and topology.door_container is None
    assert topology.router.role == "router" and topology.router.slot is None
    assert [r.role for r in topology.routers] == ["router"]


def two_door_nodes_outputs() -> dict:
    """door_outputs() with the door on DOOR_NODE and 10.0.0.2 (components/cluster.py's
    door_output): each node's door and keepalived, and the virtual IP."""
    outputs = door_outputs()
    other, state_file = "10.0.0.2", "/opt/kimipd/router-31000/vip/state"
    outputs["containers"] |= {
        role: {"node": node, "container": container, "healthUrl": "http://10.0.0.9:29100/health"}
        for role, node, container in (
            ("keepalived-10-0-0-2", other, "kimipd-keepalived"),
            ("door-10-0-0-2", other, "kimipd-door"), ("keepalived", DOOR_NODE,
                                                      "kimipd-keepalived"))}
    # The other door node first, and a lower address: router.node is still the first one read.
    outputs["door"]["nodes"] = {
        other: {"role": "door-10-0-0-2", "container": "kimipd-door",
                "metricsUrl": f"http://{other}:29100/metrics",
                "adminSocket": "/opt/kimipd/router-31000/door/b.sock",
                "keepalived": {"role": "keepalived-10-0-0-2", "container": "kimipd-keepalived",
                               "stateFile": state_file}, "peer": DOOR_NODE},
        DOOR_NODE: {"role": "door", "container": "kimipd-door",
                    "metricsUrl": f"http://{DOOR_NODE}:29100/metrics",
                    "adminSocket": outputs["door"]["adminSocket"],
                    "keepalived": {"role": "keepalived", "container": "kimipd-keepalived",
                                   "stateFile": state_file}, "peer": other}}
    outputs["door"]["virtualIp"] = {"address": "10.0.0.9", "prefixLength": 32,
                                    "interface": "bond1", "vrid": 51, "advertIntervalMs": 100,
                                    "checkFile": "/opt/kimipd/router-31000/vip/door-down"}
    return outputs


def test_the_door_on_two_nodes_is_read_with_its_virtual_ip() -> None:
    topology = Topology.from_outputs("s", two_door_nodes_outputs())
    door = topology.door
    assert door is not None and door.virtual_ip is not None
    assert (door.virtual_ip.address, door.virtual_ip.prefix_length, door.virtual_ip.interface,
            door.virtual_ip.vrid) == ("10.0.0.9", 32, "bond1", 51)
    assert [(n.address, n.door_role, n.keepalived_role, n.keepalived_container, n.state_file)
            for n in door.nodes] == [
        (DOOR_NODE, "door", "keepalived", "kimipd-keepalived",
         "/opt/kimipd/router-31000/vip/state"),
        ("10.0.0.2", "door-10-0-0-2", "keepalived-10-0-0-2", "kimipd-keepalived",
         "/opt/kimipd/router-31000/vip/state")]
    # Both doors before the slots, keepalived after; --role door and --role keepalived take both.
    assert [c.role for c in topology.containers][3:] == [
        "door", "door-10-0-0-2", "router-a", "router-b", "keepalived", "keepalived-10-0-0-2"]
    assert [ref.role for ref in topology.select(["keepalived"])] == [
        "keepalived", "keepalived-10-0-0-2"]
    assert [ref.role for ref in topology.select(["door"])] == ["door", "door-10-0-0-2"]
    # Each door's runtime API on its node.
    outputs = two_door_nodes_outputs()
    assert [(n.address, n.admin_socket) for n in Topology.from_outputs("s", outputs).door.nodes
            ] == [(DOOR_NODE, outputs["door"]["adminSocket"]),
                  ("10.0.0.2", "/opt/kimipd/router-31000/door/b.sock")]
    # One door node: neither.
    single = Topology.from_outputs("s", door_outputs()).door
    assert single is not None and (single.nodes, single.virtual_ip) == ((), None)


def test_a_door_node_without_its_keepalived_state_file_says_so() -> None:
    outputs = two_door_nodes_outputs()
    del outputs["door"]["nodes"][DOOR_NODE]["keepalived"]["stateFile"]
    with pytest.raises(StackError, match=r"(?s)do not match version 1's model.*"
                                         r"door\.nodes\.`10\.0\.0\.5`\.keepalived\.stateFile"):
        Topology.from_outputs("s", outputs)


def test_a_door_output_that_cannot_be_read_says_so() -> None:
    outputs = door_outputs()
    del outputs["door"]["adminSocket"]
    with pytest.raises(StackError, match=r"(?s)do not match version 1's model.*"
                                         r"door\.adminSocket"):
        Topology.from_outputs("s", outputs)


def test_outputs_of_another_version_are_refused_with_what_to_do() -> None:
    for version in (None, 2):
        outputs = door_outputs() | {"version": version}
        with pytest.raises(StackError, match=f"stack s: the stack's outputs are of version "
                                             f"{version}, and this checkout reads version 1.*"
                                             "`pulumi up` it with this checkout"):
            Topology.from_outputs("s", outputs)
    # None at all: a stack never deployed (or whose first `up` was killed) has nothing to ask.
    empty = Topology.from_outputs("s", {})
    assert (empty.serving, empty.containers, empty.nodes, empty.door) == (False, (), (), None)


def test_the_config_says_the_router_kind_the_door_tls_and_the_door_roles(
        fake_pulumi: Path) -> None:
    (fake_pulumi / "outputs.json").write_text(json.dumps(door_outputs(tls=True)))
    router = {"node": DOOR_NODE, "kind": "rust", "door": {
        "image": "registry:5000/haproxy@sha256:" + "0" * 64,
        "tls": {"certificate": "-----BEGIN CERTIFICATE-----\nA\n", "caCertificate": None}}}
    config = dict(PULUMI_CONFIG) | {"kimipd:router": {"value": json.dumps(router),
                                                      "objectValue": router, "secret": False}}
    (fake_pulumi / "config.json").write_text(json.dumps(config))
    stack = load_stack("pro6000", cwd=fake_pulumi)
    assert stack.router_kind == "rust"
    assert stack.door_tls is not None
    assert stack.door_tls.certificate == "-----BEGIN CERTIFICATE-----\nA\n"
    assert stack.door_tls.ca_certificate is None
    # A config the model refuses (no groups, no model...) defines no roles, and says why.
    assert stack.roles == frozenset() and "invalid kimipd stack configuration" in str(
        stack.roles_problem)
    # without router settings: the schema's default kind, no TLS
    (fake_pulumi / "config.json").write_text(json.dumps(PULUMI_CONFIG))
    stack = load_stack("pro6000", cwd=fake_pulumi)
    assert (stack.router_kind, stack.door_tls) == ("mini-lb", None)


@pytest.mark.parametrize(("stack_name", "door_roles"), [
    ("sim", {"door", "router-a", "router-b"}),
    ("sim-2p2d", {"door", "door-10-231-60-7", "keepalived", "keepalived-10-231-60-7",
                  "router-a", "router-b"})])
def test_the_roles_come_from_the_typed_config(fake_pulumi: Path, stack_name: str,
                                              door_roles: set[str]) -> None:
    values = stack_values(stack_name)
    config = {f"kimipd:{key}": {"value": json.dumps(value), "objectValue": value,
                                "secret": False} for key, value in values.items()}
    (fake_pulumi / "config.json").write_text(json.dumps(config))
    stack = load_stack(stack_name, cwd=fake_pulumi)
    assert stack.roles_problem is None
    ranks = {f"{name}-r{rank}" for name, group in values["groups"].items()
             for rank in range(len(group["nodes"]))}
    assert stack.roles == frozenset({"mooncake-master", "router", *ranks, *door_roles})


def test_the_progress_line_says_nothing_on_a_pipe_or_with_json(capsys, monkeypatch) -> None:
    """verify and logs show a live line on a terminal; a pipe, a file or --json get nothing."""
    for json_flag, tty in ((False, False), (True, True)):
        monkeypatch.setattr("sys.stderr.isatty", lambda tty=tty: tty)
        with progress_line(Namespace(json=json_flag)) as progress:
            progress("verify: request 1/3 short")
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", ""), (json_flag, tty)
