"""Contract: the program's real outputs (every shipped stack, under Pulumi's mocks) are what its
readers take. They validate against the one model (components/outputs.py) with nothing left
over; ops' topology, `kimipd orphans` and the observability project read them; and every
container the program creates is known to each, by the role its `kimipd.role` label carries.
docs/configuration.md's outputs table names every field of the model."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from components import outputs as outputs_module
from components.outputs import OUTPUTS_VERSION, StackOutputs, read_outputs
from components.render import DOOR, MOONCAKE_MASTER, ROUTER
from observability.serving import serving_stack
from ops.stack import roles_from_config
from ops.topology import Topology
from tests.conftest import REPO, STACK_FILES, stack_values
from tests.program.harness import Run, run_program, with_local_files

STACKS = [path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in STACK_FILES]


def program_run(name: str, directory, metrics: bool = False) -> tuple[str, dict, Run]:
    values = stack_values(name)
    for node_file in values.get("nodeFiles") or []:
        node_file.pop("sha256", None)  # with_local_files writes stand-in files
    if metrics:
        values["metrics"] = (values.get("metrics") or {}) | {"enabled": True}
    values = with_local_files(values, directory)
    return name, values, run_program(values)


@pytest.fixture(scope="module", params=STACKS)
def shipped(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Run]:
    """A shipped stack's config and the program's run of it (its node files at hand)."""
    return program_run(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module", params=STACKS)
def monitored(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Run]:
    """A shipped stack with metrics.enabled, as the observability project requires."""
    return program_run(request.param, tmp_path_factory.mktemp(request.param), metrics=True)


def test_the_outputs_validate_against_the_model_with_nothing_left_over(shipped) -> None:
    name, _, run = shipped
    outputs = run.stack_outputs
    typed = read_outputs(outputs)
    assert typed.version == OUTPUTS_VERSION
    # extra="forbid" throughout: an output the model does not know fails above; and the model
    # gives back what the program exported, key for key.
    assert set(typed.exported()) == set(outputs), name
    assert typed.exported()["groups"] == outputs["groups"]


def test_ops_topology_knows_every_container_the_program_creates(shipped) -> None:
    name, _, run = shipped
    topology = Topology.from_outputs(name, run.stack_outputs)
    by_role = {ref.role: ref for ref in topology.containers}
    names = {role: container.inputs["name"]
             for role, container in run.containers().items()}
    assert set(by_role) == set(names), name
    assert {role: ref.name for role, ref in by_role.items()} == names
    for role, ref in by_role.items():
        assert ref.node in topology.nodes, (role, ref.node)
    door = topology.door
    if door is not None:
        known = {door.container} | {slot.container for slot in door.slots}
        known |= {node.door_container for node in door.nodes}
        known |= {node.keepalived_container for node in door.nodes}
        roles = {slot.role for slot in door.slots}
        roles |= {node.door_role for node in door.nodes} | {node.keepalived_role
                                                            for node in door.nodes}
        assert roles <= set(by_role), roles - set(by_role)
        assert known <= set(names.values())


def test_orphans_judges_by_every_role_the_program_creates(shipped) -> None:
    name, values, run = shipped
    roles, problem = roles_from_config(values)
    assert problem is None, problem
    created_roles = set(run.containers())
    assert created_roles <= roles, created_roles - roles
    if values["router"].get("door", {}).get("virtualIp"):
        # The door on two nodes: a keepalived and the other node's door are among them.
        assert any(role.startswith("keepalived-") for role in created_roles)
        assert any(role.startswith(DOOR + "-") for role in created_roles)


def test_the_observability_project_reads_the_outputs_and_knows_every_role(monitored) -> None:
    name, _, run = monitored
    outputs = run.stack_outputs
    serving = serving_stack(f"organization/kimipd/{name}", outputs)
    typed = read_outputs(outputs)
    assert serving.verification is not None
    assert serving.firewall == typed.firewall.model_dump(by_alias=True)
    ranks = {role for role in run.containers() if role.startswith(tuple(typed.groups))}
    expected = {MOONCAKE_MASTER, *ranks, ROUTER} | ({DOOR} if typed.door else set())
    assert serving.roles == expected, serving.roles ^ expected
    # Every door node's exporter and every slot's router on its node.
    if typed.door is not None:
        door_nodes = set(typed.door.nodes or {typed.door.node: None})
        scraped = {(entry["labels"]["role"], entry["labels"]["node"], entry["labels"].get("slot"))
                   for entry in serving.targets}
        assert {(DOOR, node, None) for node in door_nodes} <= scraped
        assert {(ROUTER, slot.node or typed.door.node, name)
                for name, slot in typed.door.slots.items()} <= scraped


MODELS = {name: value for name, value in vars(outputs_module).items()
          if isinstance(value, type) and issubclass(value, BaseModel)}


def _aliases(model: type[BaseModel]) -> dict[str, type[BaseModel] | None]:
    """Each field's camelCase name -> the model of its values, if they are one of the outputs'."""
    found: dict[str, type[BaseModel] | None] = {}
    for field in model.model_fields.values():
        named = [MODELS[word] for word in re.findall(r"\w+", str(field.annotation))
                 if word in MODELS]
        found[field.alias or ""] = named[0] if named else None
    return found


def test_the_docs_table_names_every_output_and_every_field() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    table = text[text.index("## Stack outputs"):]
    rows = {match.group(1): match.group(2)
            for match in re.finditer(r"^\| `(\w+)` \|[^|]*\| (.*) \|$", table, re.MULTILINE)}
    outputs = _aliases(StackOutputs)
    assert set(rows) == set(outputs), set(rows) ^ set(outputs)
    for name, nested in outputs.items():
        pending = [nested] if nested is not None else []
        while pending:
            model = pending.pop()
            for field, inner in _aliases(model).items():
                assert f"`{field}`" in rows[name], f"docs/configuration.md: `{name}` " \
                                                   f"does not name `{field}`"
                if inner is not None:
                    pending.append(inner)
