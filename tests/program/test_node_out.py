"""A node taken out (`nodes[].out`) under Pulumi's mocks, on stack sim-2p2d: nothing is
registered on it, its groups leave whole (ranks on other nodes too), everything else is what it
was, the preview says so; what must stay is refused by name before anything is registered."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.conftest import stack_values
from tests.program.harness import Registration, Run, run_program, run_refused, with_local_files

pytestmark = pytest.mark.timeout(120)  # the SDK's threads can hang under mocks (pulumi#7663)

OUT = "10.231.60.8"  # decode-b's rank 1


@pytest.fixture(scope="module")
def values(tmp_path_factory: pytest.TempPathFactory) -> dict:
    values = stack_values("sim-2p2d")
    for node_file in values["nodeFiles"]:
        node_file.pop("sha256")
    return with_local_files(values, tmp_path_factory.mktemp("node-out"))


def taken_out(values: dict, *addresses: str) -> dict:
    changed = copy.deepcopy(values)
    for node in changed["nodes"]:
        if node["address"] in addresses:
            node["out"] = True
    return changed


@pytest.fixture(scope="module")
def both(values: dict) -> tuple[Run, Run]:
    return run_program(values), run_program(taken_out(values, OUT))


def dials(resource: Registration) -> str | None:
    connection = resource.inputs.get("connection") or {}
    host = resource.inputs.get("host") or ""
    return connection.get("host") or (host.rsplit("@", 1)[-1].split(":")[0] if host else None)


def test_nothing_is_registered_on_the_node_taken_out(both: tuple[Run, Run]) -> None:
    before, after = both
    assert any(dials(r) == OUT for r in before.resources)
    assert [r.name for r in after.resources if dials(r) == OUT] == []
    assert not [r for r in after.resources if "node-10-231-60-8" in r.name]


def test_its_group_leaves_whole_and_the_rest_is_what_it_was(both: tuple[Run, Run]) -> None:
    before, after = both
    gone = {r.name for r in before.resources} - {r.name for r in after.resources}
    assert {"decode-b-drain", "decode-b-want", "decode-b-admit"} <= gone
    # Rank 0 of decode-b runs on 10.231.60.7, which stays in: it goes with its group.
    assert "decode-b-r0" in {k for k in before.containers()} - set(after.containers())
    assert all(not name.startswith(("decode-a", "prefill-")) for name in gone), sorted(gone)
    kept = {r.name: r for r in after.resources}
    for resource in before.resources:
        if resource.name in kept and dials(resource) not in (OUT, None) and \
                resource.type == "docker:index/container:Container":
            assert kept[resource.name].inputs == resource.inputs, resource.name
    # Every other node's firewall still admits the node taken out: none of them changes.
    for resource in before.of_type("command:remote:Command"):
        if resource.name.endswith("-firewall") and dials(resource) != OUT:
            assert kept[resource.name].inputs == resource.inputs, resource.name
    assert after.stack_outputs["nodes"][OUT] == {"roles": [], "out": True}
    assert "decode-b" not in after.stack_outputs["groups"]


def test_the_preview_says_which_groups_leave_and_that_the_node_is_not_contacted(
        both: tuple[Run, Run]) -> None:
    _, after = both
    notes = [w for w in after.warnings if "is out" in w]
    assert len(notes) == 1, after.warnings
    assert f"node {OUT} is out" in notes[0] and "decode-b leaves every router slot" in notes[0]
    assert f"Nothing on {OUT} is contacted" in notes[0] and "scripts/kimipd" in notes[0]


@pytest.mark.parametrize(("addresses", "expected"), [
    (("10.231.60.5",), "nodes[4].out: '10.231.60.5' holds the router (router.node)"),
    (("10.231.60.1",), "nodes[0].out: '10.231.60.1' runs the Mooncake master"),
    (("10.231.60.6", "10.231.60.8"), "nodes[].out: every decode group would leave"),
])
def test_what_must_stay_is_refused_by_name(values: dict, addresses: tuple[str, ...],
                                           expected: str) -> None:
    message, run = run_refused(taken_out(values, *addresses))
    assert expected in message, message
    assert run.resources == [] or all(r.type == "pulumi:pulumi:Stack" for r in run.resources)


OTHER_DOOR_NODE = "10.231.60.7"  # the other door node (router.door.nodes), decode-b's rank 0


def test_the_other_door_node_out_leaves_router_node_the_door_and_slot_b(values: dict) -> None:
    run = run_program(taken_out(values, OTHER_DOOR_NODE))
    assert [r.name for r in run.resources if dials(r) == OTHER_DOOR_NODE] == []
    containers = run.containers()
    assert "router-b" in containers and "router-a" in containers
    assert containers["router-b"].provider.split("::")[-2] == "node-10-231-60-5-docker"
    # Under a name of its own: the copy on the node out is deleted (dropped), not moved.
    assert containers["router-b"].name == "router-b-stand-in"
    assert "router-b-stand-in-health" in {r.name for r in run.resources}
    roles = set(containers)
    assert {"door", "keepalived"} <= roles
    assert not [role for role in roles if role.endswith("10-231-60-7")], sorted(roles)
    door = run.stack_outputs["door"]
    assert (list(door["nodes"]), door["nodesOut"]) == (["10.231.60.5"], [OTHER_DOOR_NODE])
    assert door["slots"]["b"]["url"] == "http://10.231.60.5:31002"
    notes = [w for w in run.warnings if "is out" in w]
    assert len(notes) == 1 and "slot b stands in there" in notes[0], run.warnings
