"""The door on two nodes under Pulumi's mocks, as pro6000 ships it (router.door.nodes [.5, .7]):
a door on each door node, slot b on the other one, each slot drained and admitted at both doors,
keepalived beside each door and clients on the virtual IP. pro6000's keepalived image is a
placeholder the program refuses; the tests set a built one's reference in its place
(harness.with_local_files), as an operator does."""

from __future__ import annotations

import copy
import json

import pytest

from components.config.placeholders import KEEPALIVED_IMAGE_PLACEHOLDER
from tests.conftest import stack_values
from tests.program.harness import (
    KEEPALIVED_IMAGE, ROUTER_API_KEY, SECRET_SIG, SIG_KEY, Registration, Run, run_program,
    run_refused, with_local_files)

pytestmark = pytest.mark.timeout(180)  # the SDK's threads can hang under mocks (pulumi#7663)

ROUTER_NODE, OTHER = "174.1.60.5", "174.1.60.7"
VIP = "174.1.60.100"
OTHER_DOOR = "door-174-1-60-7"
OTHER_KEEPALIVED = "keepalived-174-1-60-7"


@pytest.fixture(scope="module")
def values(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """pro6000 as it ships, with its node files, known hosts and keepalived image at hand."""
    return with_local_files(stack_values("pro6000"), tmp_path_factory.mktemp("two-door-nodes"))


@pytest.fixture(scope="module")
def run(values: dict) -> Run:
    return run_program(copy.deepcopy(values))


@pytest.fixture(scope="module")
def one_door_node(values: dict) -> Run:
    """pro6000 with the door on router.node alone."""
    values = copy.deepcopy(values)
    values["router"]["door"] = {key: value for key, value in values["router"]["door"].items()
                                if key not in ("nodes", "virtualIp")}
    return run_program(values)


def host(resource: Registration) -> str:
    return resource.inputs["connection"]["value"]["host"]  # the connection is a secret


def provider_node(resource: Registration) -> str:
    return resource.provider.split("::")[-2].removesuffix("-docker").removeprefix("node-")


def test_the_two_door_stack_deploys(values: dict, run: Run) -> None:
    assert values["router"]["door"]["nodes"] == [ROUTER_NODE, OTHER]
    assert values["router"]["door"]["virtualIp"] == {"address": VIP, "image": KEEPALIVED_IMAGE}
    assert run.stack_outputs["routerUrl"] == f"http://{VIP}:31000"
    assert not [w for w in run.warnings if "router.door" in w]


def test_pro6000_s_placeholder_keepalived_image_is_refused_before_any_resource(
        values: dict) -> None:
    values = copy.deepcopy(values)
    values["router"]["door"]["virtualIp"]["image"] = KEEPALIVED_IMAGE_PLACEHOLDER
    message, registered = run_refused(values)
    assert (f"router.door.virtualIp.image: {KEEPALIVED_IMAGE_PLACEHOLDER!r} is a placeholder"
            in message)
    assert "scripts/build-keepalived-image REGISTRY/kimipd/keepalived" in message
    assert "pulumi config set --path router.door.virtualIp.image REF -s test" in message
    assert registered.resources == []


def test_sim_2p2d_deploys_the_door_on_router_node_and_decode_b_s_rank_0(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    values = stack_values("sim-2p2d")
    for node_file in values["nodeFiles"]:
        node_file.pop("sha256")  # with_local_files writes stand-in files
    sim = run_program(with_local_files(values, tmp_path_factory.mktemp("sim-2p2d")))
    containers = sim.containers()
    assert {role: provider_node(containers[role]) for role in (
        "door", "door-10-231-60-7", "router-a", "router-b", "keepalived",
        "keepalived-10-231-60-7")} == {
        "door": "10-231-60-5", "door-10-231-60-7": "10-231-60-7", "router-a": "10-231-60-5",
        "router-b": "10-231-60-7", "keepalived": "10-231-60-5",
        "keepalived-10-231-60-7": "10-231-60-7"}
    assert sim.named("keepalived-image").inputs["name"] == (
        "10.231.60.254:5000/kimipd/sim-keepalived:latest")
    assert sim.stack_outputs["routerUrl"] == "http://10.231.60.100:31000"


def test_one_door_node_keeps_every_name(one_door_node: Run) -> None:
    names = {resource.name for resource in one_door_node.resources}
    assert {"door", "door-image", "door-config", "door-ready", "door-health", "router-api-key",
            "router-a-door-drain", "router-b-door-admit"} <= names
    assert not [name for name in names if "door-174-1-60" in name]
    assert not [name for name in names if name.startswith("router-key-")]


def test_a_door_on_each_door_node(run: Run) -> None:
    containers = run.containers()
    here, there = containers["door"], containers[OTHER_DOOR]
    assert provider_node(here) == "174-1-60-5" and provider_node(there) == "174-1-60-7"
    assert here.inputs["name"] == there.inputs["name"] == "kimipd-door"
    assert here.inputs["command"] == there.inputs["command"]
    configs = run.named("door-config"), run.named(f"{OTHER_DOOR}-config")
    assert [host(config) for config in configs] == [ROUTER_NODE, OTHER]
    # One configuration for both: each door sends to both slots at their nodes.
    assert configs[0].inputs["stdin"] == configs[1].inputs["stdin"]
    assert f"server slot-b {OTHER}:31002 check" in configs[1].inputs["stdin"]
    assert run.waits_for(there, configs[1]) and run.waits_for(there, run.named(
        f"{OTHER_DOOR}-image"))
    gate = run.named(f"{OTHER_DOOR}-health")
    assert host(gate) == OTHER and f"http://{OTHER}:29100/health" in gate.inputs["create"]
    assert run.waits_for(there, run.named("node-174-1-60-7-nftables"))


def test_slot_b_runs_on_the_other_door_node_with_its_own_key_file(run: Run) -> None:
    containers = run.containers()
    assert provider_node(containers["router-a"]) == "174-1-60-5"
    assert provider_node(containers["router-b"]) == "174-1-60-7"
    key_file = run.named("router-api-key-174-1-60-7")
    assert host(key_file) == OTHER
    assert key_file.raw_inputs["stdin"].get(SIG_KEY) == SECRET_SIG
    labels = {label["label"]: label["value"] for label in containers["router-b"]
              .inputs["labels"]}
    assert labels["kimipd.api-key-file"] == "router-api-key-174-1-60-7-id"
    assert run.waits_for(containers["router-b"], key_file)
    gate = run.named("router-b-health")
    assert host(gate) == OTHER and f"http://{OTHER}:31002/health" in gate.inputs["create"]
    # The markers are on router.node: slot b's new router gets its groups from there.
    restore = run.named("router-b-restore")
    assert host(restore) == ROUTER_NODE
    assert f"--router http://{OTHER}:31002" in restore.inputs["create"]


@pytest.mark.parametrize("slot", ["a", "b"])
def test_each_slot_is_drained_and_admitted_at_both_doors(run: Run, slot: str) -> None:
    role = f"router-{slot}"
    container = run.containers()[role]
    drain, remote_drain = run.named(f"{role}-door-drain"), run.named(f"{role}-{OTHER_DOOR}-drain")
    admit, remote_admit = run.named(f"{role}-door-admit"), run.named(f"{role}-{OTHER_DOOR}-admit")
    # router.node's decide (lease, markers); the other door node's follow.
    assert [host(r) for r in (drain, admit, run.named(f"{role}-door-want"))] == [ROUTER_NODE] * 3
    assert [host(r) for r in (remote_drain, remote_admit)] == [OTHER, OTHER]
    assert "door-slots.py drain " in drain.inputs["delete"]
    assert "door-slots.py door-drain " in remote_drain.inputs["delete"]
    assert "--router" not in remote_drain.inputs["delete"]
    # Deleted after router.node's drain (it depends on it), before the container.
    assert run.waits_for(drain, remote_drain)
    assert run.waits_for(remote_drain, container)
    assert run.waits_for(remote_drain, run.containers()[OTHER_DOOR])
    assert remote_drain.inputs["triggers"] == drain.inputs["triggers"] == [f"{role}-id"]
    # Ready at the other door before router.node's admission gives the lease back.
    assert run.waits_for(admit, remote_admit)
    for earlier in (f"{role}-ready", f"{OTHER_DOOR}-ready", f"{role}-restore"):
        assert run.waits_for(remote_admit, run.named(earlier)), earlier
    node = ROUTER_NODE if slot == "a" else OTHER
    port = 31001 if slot == "a" else 31002
    assert remote_admit.inputs["create"].endswith(f" --router http://{node}:{port}")
    assert "door-slots.py door-admit " in remote_admit.inputs["create"]
    assert "--api-key-file" not in remote_admit.inputs["create"]


def test_the_smoke_test_runs_again_when_either_door_is_replaced(run: Run) -> None:
    smoke = run.named("smoke-test-generate")
    assert {"door-id", f"{OTHER_DOOR}-id"} <= set(smoke.inputs["triggers"])


def test_no_secret_in_plain_inputs(run: Run) -> None:
    for resource in run.resources:
        for name in ("create", "update", "delete", "command", "envs", "labels", "stdin"):
            value = resource.raw_inputs.get(name)
            if isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG:
                continue
            assert ROUTER_API_KEY not in json.dumps(value or ""), (resource.name, name)


@pytest.mark.parametrize("node, role", [(ROUTER_NODE, "keepalived"),
                                        (OTHER, OTHER_KEEPALIVED)])
def test_keepalived_beside_each_door_with_its_check_loop(run: Run, node: str, role: str) -> None:
    container = run.containers()[role]
    assert provider_node(container) == node.replace(".", "-")
    inputs = container.inputs
    assert inputs["name"] == "kimipd-keepalived"
    assert (inputs["networkMode"], inputs["restart"], inputs["entrypoints"]) == (
        "host", "no", ["bash"])
    assert inputs["capabilities"]["adds"] == ["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BROADCAST"]
    assert not inputs.get("privileged")
    # One process tree: the loop and keepalived end together (assets/virtual-ip.sh).
    command = inputs["command"]
    assert command[0] == "/opt/kimipd/virtual-ip.sh"
    assert command[command.index("--door") + 1] == f"{node}:29100"
    assert command[command.index("--interval") + 1] == "0.1"
    assert command[command.index("--check-file") + 1] == "/opt/kimipd/router-31000/vip/door-down"
    # Cleared as the container starts: no state of before a restart is shown.
    assert command[command.index("--state-file") + 1] == "/opt/kimipd/router-31000/vip/state"
    labels = {label["label"]: label["value"] for label in inputs["labels"]}
    assert labels == {"kimipd.role": role}  # restartGeneration does not move the address
    image = run.named(f"{role}-image")
    assert image.inputs["name"] == KEEPALIVED_IMAGE and image.inputs["keepLocally"]
    assert run.waits_for(container, image)
    # After the node's firewall (strangers' VRRP dropped), its config and its door; on destroy
    # before the door, so the address leaves while the door still serves.
    config = run.named(f"{role}-config")
    door = run.containers()["door" if node == ROUTER_NODE else OTHER_DOOR]
    for earlier in (config, door, run.named(f"node-{node.replace('.', '-')}-nftables")):
        assert run.waits_for(container, earlier), earlier.name
    assert host(config) == node and config.inputs["create"] == config.inputs["update"]
    assert f"unicast_src_ip {node}" in config.inputs["stdin"]
    # Checked by the image's own keepalived on the node's network (it refuses a missing
    # interface), then reloaded in place.
    assert ("docker run --rm --network host --entrypoint keepalived -v "
            "/opt/kimipd/router-31000/vip:/opt/kimipd/router-31000/vip:ro "
            f"{KEEPALIVED_IMAGE} -t -f /opt/kimipd/router-31000/vip/keepalived.conf.new"
            ) in config.inputs["create"]
    assert config.inputs["create"].endswith("docker kill --signal HUP kimipd-keepalived "
                                            ">/dev/null; fi")
    assert config.inputs["delete"] == "rm -rf /opt/kimipd/router-31000/vip"
    gate = run.named(f"{role}-health")
    assert host(gate) == node and f"http://{VIP}:29100/health" in gate.inputs["create"]


def test_the_smoke_test_waits_for_the_virtual_ip(run: Run) -> None:
    smoke = run.named("smoke-test-generate")
    for role in ("keepalived", OTHER_KEEPALIVED):
        assert run.waits_for(smoke, run.named(f"{role}-health")), role


def test_one_door_node_runs_no_keepalived(one_door_node: Run) -> None:
    assert not [r.name for r in one_door_node.resources if "keepalived" in r.name]


def test_clients_are_given_the_virtual_ip(run: Run) -> None:
    outputs = run.stack_outputs
    assert outputs["routerUrl"] == f"http://{VIP}:31000"
    assert outputs["generateUrl"] == f"http://{VIP}:31000/generate"
    # The smoke test goes through it too, from router.node.
    smoke = run.named("smoke-test-generate")
    assert f"--url http://{VIP}:31000/generate" in smoke.inputs["create"]


def test_the_door_output_lists_both_door_nodes_and_the_virtual_ip(run: Run) -> None:
    door = run.stack_outputs["door"]
    assert (door["url"], door["node"], door["container"]) == (
        f"http://{VIP}:31000", ROUTER_NODE, "kimipd-door")
    # stateFile: what keepalived's notify script writes and `kimipd status` reads there;
    # adminSocket: each door's runtime API on its node (status reads both doors' views).
    state_file = "/opt/kimipd/router-31000/vip/state"
    socket = "/opt/kimipd/router-31000/door/admin.sock"
    assert door["nodes"] == {
        ROUTER_NODE: {"role": "door", "container": "kimipd-door",
                      "metricsUrl": f"http://{ROUTER_NODE}:29100/metrics",
                      "adminSocket": socket,
                      "keepalived": {"role": "keepalived", "container": "kimipd-keepalived",
                                     "stateFile": state_file},
                      "peer": OTHER},
        OTHER: {"role": OTHER_DOOR, "container": "kimipd-door",
                "metricsUrl": f"http://{OTHER}:29100/metrics",
                "adminSocket": socket,
                "keepalived": {"role": OTHER_KEEPALIVED,
                               "container": "kimipd-keepalived", "stateFile": state_file},
                "peer": ROUTER_NODE}}
    assert door["virtualIp"] == {"address": VIP, "prefixLength": 32, "interface": "bond1",
                                 "vrid": 51, "advertIntervalMs": 100,
                                 "checkFile": "/opt/kimipd/router-31000/vip/door-down"}
    assert {name: (slot["node"], slot["url"]) for name, slot in door["slots"].items()} == {
        "a": (ROUTER_NODE, f"http://{ROUTER_NODE}:31001"), "b": (OTHER, f"http://{OTHER}:31002")}
    containers = run.stack_outputs["containers"]
    assert {role: containers[role]["node"] for role in (
        "door", OTHER_DOOR, "router-a", "router-b", "keepalived", OTHER_KEEPALIVED)} == {
        "door": ROUTER_NODE, OTHER_DOOR: OTHER, "router-a": ROUTER_NODE, "router-b": OTHER,
        "keepalived": ROUTER_NODE, OTHER_KEEPALIVED: OTHER}
    assert run.stack_outputs["nodes"][OTHER]["roles"][-3:] == [
        OTHER_DOOR, "router-b", OTHER_KEEPALIVED]


def test_one_door_node_keeps_its_outputs(one_door_node: Run) -> None:
    outputs = one_door_node.stack_outputs
    assert outputs["routerUrl"] == f"http://{ROUTER_NODE}:31000"
    door = outputs["door"]
    assert "nodes" not in door and "virtualIp" not in door
    assert not [slot for slot in door["slots"].values() if "node" in slot]
    assert door["slots"]["b"]["url"] == f"http://{ROUTER_NODE}:31002"
    assert outputs["nodes"][ROUTER_NODE]["roles"][-3:] == ["door", "router-a", "router-b"]
