"""The 2P2D stack's halves and its serving contract under Pulumi's mocks: each decode group waits
for its own half of the prefill groups (a change of contract can then roll a prefill and a
decode group while the other half serves), and every admission carries the stack's contract,
its door socket and each slot's name there."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import stack_values
from tests.program.harness import Run, run_program, with_local_files

pytestmark = pytest.mark.timeout(180)  # the SDK's threads can hang under mocks (pulumi#7663)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    values = stack_values("sim-2p2d")
    # The stack file pins the sim's own builds of the node files; the test's stand-ins are others.
    values["nodeFiles"] = [{key: value for key, value in entry.items() if key != "sha256"}
                           for entry in values["nodeFiles"]]
    return run_program(with_local_files(values, tmp_path_factory.mktemp("halves")))


@pytest.mark.parametrize("decode, own, other", [("decode-a", "prefill-a", "prefill-b"),
                                                ("decode-b", "prefill-b", "prefill-a")])
def test_each_decode_group_waits_for_its_half_of_the_prefill_groups(
        run: Run, decode: str, own: str, other: str) -> None:
    rank0 = run.containers()[f"{decode}-r0"]
    groups = {r.name: r for r in run.of_type("kimipd:serving:ServingGroup")}
    assert run.waits_for(rank0, groups[own]), f"{decode} does not wait for {own}"
    assert not run.waits_for(rank0, groups[other]), f"{decode} waits for {other} too"


def test_every_admission_carries_the_serving_contract_and_the_door(run: Run) -> None:
    contract = run.stack_outputs["servingContract"]
    assert contract["model"]["path"] == stack_values("sim-2p2d")["model"]["path"]
    assert len(contract["digest"]) == 16
    # The image its node holds under the config's reference is part of what it declares (the
    # mocks give the image docker's id of its name's digest).
    image = hashlib.sha256(stack_values("sim-2p2d")["image"].encode()).hexdigest()[:12]
    for group in ("prefill-a", "prefill-b", "decode-a", "decode-b"):
        create = run.named(f"{group}-admit").inputs["create"]
        assert create.endswith(f"--contract {contract['digest']}-{image}"), group
        assert "--slot slot-a" in create and "--slot slot-b" in create, group
        assert "--door-socket /opt/kimipd/router-31000/door/admin.sock" in create, group
