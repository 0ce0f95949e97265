"""`scripts/kimipd orphans`: what a killed `up` left behind, found against the state and removed
group by group. Nodes here are canned `docker` listings; tests/integration/test_faults.py runs
the command against the sim's real nodes after a real SIGKILL."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ops import DEGRADED, DOWN, OK
from ops.cli import main
from ops.orphans import (LIST_COMMAND, NodeContainer, find_orphans, known_container_ids,
                         parse_listing)
from ops.remote import RemoteError, RemoteResult
from ops.stack import roles_from_config
from tests.conftest import stack_values
from tests.outputs import complete_outputs

NODES = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def container(node: str, role: str, group: str | None, cid: str) -> NodeContainer:
    return NodeContainer(node=node, id=cid * 64, name=f"kimipd-{role}", role=role, group=group,
                         state="running")


# mc-master and prefill on .1 and .2, decode on .2 and .3, the router on .3.
ON_NODES = [
    container(NODES[0], "mooncake-master", None, "a"),
    container(NODES[0], "prefill-r0", "prefill", "b"),
    container(NODES[1], "prefill-r1", "prefill", "c"),
    container(NODES[1], "decode-r0", "decode", "d"),
    container(NODES[2], "decode-r1", "decode", "e"),
    container(NODES[2], "router", None, "f"),
]


def export(ids: list[str]) -> dict:
    resources = [{"type": "pulumi:pulumi:Stack", "urn": "urn:stack"},
                 {"type": "docker:index/container:Container", "id": ""}]  # a pending create
    resources += [{"type": "docker:index/container:Container", "id": cid} for cid in ids]
    return {"version": 3, "deployment": {"resources": resources}}


class DockerNodes:
    """Runs `docker ps` and `docker rm -f` against a list of containers, per node."""

    def __init__(self, containers: list[NodeContainer], unreachable: tuple[str, ...] = ()) -> None:
        self.containers = list(containers)
        self.unreachable = unreachable
        self.removed: list[tuple[str, list[str]]] = []

    def close(self) -> None:
        pass

    def run(self, node, command, timeout, stdin=None, on_stdout=None) -> RemoteResult:
        if node in self.unreachable:
            raise RemoteError(f"{node}: connection refused")
        if command == LIST_COMMAND:
            lines = ["\t".join([c.id, c.name, c.role, c.group or "", c.state])
                     for c in self.containers if c.node == node]
            return RemoteResult(node, command, 0, ("\n".join(lines) + "\n").encode(), b"")
        argv = shlex.split(command)
        assert argv[:3] == ["docker", "rm", "-f"], command
        ids = argv[3:]
        assert all(c.node == node for c in self.containers if c.id in ids), "removed elsewhere"
        self.containers = [c for c in self.containers if c.id not in ids]
        self.removed.append((node, ids))
        return RemoteResult(node, command, 0, b"", b"")


def test_listing_parses_docker_ps_lines_with_and_without_a_group() -> None:
    text = f"{'a' * 64}\tkimipd-mooncake-master\tmooncake-master\t\trunning\n" \
           f"{'d' * 64}\tkimipd-decode-r0\tdecode-r0\tdecode\texited\n\n"
    assert parse_listing("10.0.0.1", text) == [
        NodeContainer("10.0.0.1", "a" * 64, "kimipd-mooncake-master", "mooncake-master", None,
                      "running"),
        NodeContainer("10.0.0.1", "d" * 64, "kimipd-decode-r0", "decode-r0", "decode", "exited")]
    assert "label=kimipd.role" in LIST_COMMAND and "--no-trunc" in LIST_COMMAND


ROLES = frozenset(c.role for c in ON_NODES)


def test_an_orphan_rank_takes_its_whole_group_and_nothing_else() -> None:
    known = known_container_ids(export([c.id for c in ON_NODES if c.role != "decode-r1"]))
    assert "" not in known
    findings = find_orphans(ON_NODES, known, ROLES)
    assert [(f.container.role, f.reason.split(",")[0]) for f in findings] == [
        ("decode-r0", "in the state"), ("decode-r1", "not in the stack's state")]


def test_an_orphan_outside_a_group_goes_alone() -> None:
    known = known_container_ids(export([c.id for c in ON_NODES if c.role != "router"]))
    assert [f.container.role for f in find_orphans(ON_NODES, known, ROLES)] == ["router"]
    assert find_orphans(ON_NODES, {c.id for c in ON_NODES}, ROLES) == []


def test_another_stacks_containers_are_left_alone() -> None:
    # sim-2p2d's groups on the same nodes: roles this stack does not define.
    other = [container(NODES[1], "decode-a-r0", "decode-a", "9")]
    assert find_orphans(ON_NODES + other, {c.id for c in ON_NODES}, ROLES) == []


def three_node_config() -> dict:
    """Stack `sim`'s values with ON_NODES's roles: a prefill and a decode group of two ranks,
    the Mooncake master and the single router. (The config gives each group nodes of its own,
    as the model wants; which node a container is found on is not what orphans judges by.)"""
    values = stack_values("sim")
    four = [*NODES, "10.0.0.4"]
    values["nodes"] = [{"address": address, "gpus": 8} for address in four]
    values["mooncakeMaster"] = values["mooncakeMaster"] | {"node": NODES[0]}
    values["groups"]["prefill"] |= {"nodes": four[:2], "tpSize": 16, "epSize": 16}
    values["groups"]["decode"] |= {"nodes": four[2:], "tpSize": 16, "epSize": 16}
    values["router"] = {key: value for key, value in values["router"].items() if key != "door"}
    values["router"]["node"] = NODES[2]
    return values


def cli(tmp_path: Path, state_ids: list[str], *args: str, nodes: DockerNodes,
        config: dict | None = None) -> int:
    (tmp_path / "outputs.json").write_text(json.dumps(complete_outputs(
        {"serving": False, "nodes": {n: {"roles": []} for n in NODES[:2]}})))
    # The config names a node the outputs do not (a first `up` killed before its outputs).
    values = three_node_config() if config is None else config
    (tmp_path / "config.json").write_text(json.dumps({f"kimipd:{key}": value
                                                      for key, value in values.items()}))
    (tmp_path / "state.json").write_text(json.dumps(export(state_ids)))
    return main(["-s", "sim", "--outputs-json", str(tmp_path / "outputs.json"), "--config-json",
                 str(tmp_path / "config.json"), "--state-json", str(tmp_path / "state.json"),
                 "orphans", *args], transport_factory=lambda access: nodes)


def test_remove_takes_the_group_off_every_node_then_finds_nothing(tmp_path: Path,
                                                                  capsys) -> None:
    nodes = DockerNodes(ON_NODES)
    state = [c.id for c in ON_NODES if c.role != "decode-r1"]
    assert cli(tmp_path, state, nodes=nodes) == DEGRADED
    text = capsys.readouterr().out
    assert "stack sim: 2 container(s) to remove, 6 kimipd container(s) on the nodes" in text
    assert "kimipd orphans --remove removes them" in text and nodes.removed == []

    assert cli(tmp_path, state, "--remove", nodes=nodes) == OK
    assert "removed 2 container(s); then: `pulumi cancel`" in capsys.readouterr().out
    assert nodes.removed == [(NODES[1], ["d" * 64]), (NODES[2], ["e" * 64])]
    assert cli(tmp_path, state, "--json", nodes=nodes) == OK
    report = json.loads(capsys.readouterr().out)
    assert report["orphans"] == [] and report["scanned"] == 4 and report["unreachable"] == {}


def test_an_unreachable_node_is_not_a_clean_bill(tmp_path: Path, capsys) -> None:
    nodes = DockerNodes(ON_NODES, unreachable=(NODES[2],))
    assert cli(tmp_path, [c.id for c in ON_NODES], "--json", nodes=nodes) == DEGRADED
    report = json.loads(capsys.readouterr().out)
    assert report["orphans"] == [] and report["scanned"] == 4
    assert report["unreachable"] == {NODES[2]: f"{NODES[2]}: connection refused"}


def test_an_unreadable_state_is_exit_2_and_touches_nothing(tmp_path: Path, capsys) -> None:
    nodes = DockerNodes(ON_NODES)
    (tmp_path / "outputs.json").write_text("{}")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "state.json").write_text("not the output of pulumi stack export")
    code = main(["--outputs-json", str(tmp_path / "outputs.json"), "--config-json",
                 str(tmp_path / "config.json"), "--state-json", str(tmp_path / "state.json"),
                 "orphans", "--remove"], transport_factory=lambda access: nodes)
    assert code == DOWN
    assert "the stack's state cannot be read" in capsys.readouterr().err
    assert len(nodes.containers) == len(ON_NODES) and nodes.removed == []


def test_the_roles_are_the_programs_keepalived_and_both_doors_included() -> None:
    """sim-2p2d: the door on two nodes with a virtual IP, named as the renderers name them."""
    roles, problem = roles_from_config(stack_values("sim-2p2d"))
    assert problem is None
    assert {"door", "door-10-231-60-7", "keepalived", "keepalived-10-231-60-7", "router-a",
            "router-b", "mooncake-master", "decode-b-r1"} <= roles, sorted(roles)


def test_a_keepalived_and_a_second_door_the_state_does_not_know_are_orphans() -> None:
    roles, _ = roles_from_config(stack_values("sim-2p2d"))
    left = [container("10.231.60.7", "keepalived-10-231-60-7", None, "k"),
            container("10.231.60.7", "door-10-231-60-7", None, "m")]
    known = {"a" * 64}
    assert [f.container.role for f in find_orphans(left, known, roles)] == [
        "keepalived-10-231-60-7", "door-10-231-60-7"]


def test_a_config_the_program_refuses_judges_nothing_and_removes_nothing(
        tmp_path: Path, capsys) -> None:
    nodes = DockerNodes(ON_NODES)
    config = three_node_config()
    config["groups"]["decode"]["tpSize"] = 24  # not the group's GPUs
    code = cli(tmp_path, [c.id for c in ON_NODES][:2], "--remove", nodes=nodes, config=config)
    assert code == DOWN
    error = capsys.readouterr().err
    assert "the config does not validate; fix it first" in error and "tpSize" in error, error
    assert nodes.removed == []
