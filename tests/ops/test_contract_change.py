"""A change of the serving contract named where `kimipd preview` shows the preview, with how it
will roll (ops/contract_change.py), read from the groups' admission commands as the program
renders them."""

from __future__ import annotations

import copy
import io
from contextlib import nullcontext

from pulumi import automation as auto

from components.config import load_cluster_config
from components.render import admit_command
from ops.contract_change import contract_change
from ops.node_out import OutUpdate
from ops.policy_pack import PolicyRun
from tests.conftest import stack_values, without_the_door


def admissions(values: dict, contract: str) -> list[dict]:
    cfg = load_cluster_config(values)
    return [{"create": admit_command(cfg, name, contract)} for name in cfg.groups]


def steps(values: dict, old: str, new: str) -> list[tuple[dict, dict]]:
    return list(zip(admissions(values, old), admissions(values, new), strict=True))


def test_a_new_contract_behind_the_door_with_two_groups_of_each_mode_rolls_in_halves() -> None:
    change = contract_change(steps(stack_values("sim-2p2d"), "c0", "c1"))
    assert change is not None and (change.old, change.new) == ("c0", "c1")
    assert change.groups == {"prefill": 2, "decode": 2} and change.door and change.in_halves
    assert "It rolls in halves behind the door (2 prefill, 2 decode groups)" in change.note()


def test_one_group_of_a_mode_or_no_door_is_an_outage() -> None:
    one = contract_change(steps(stack_values("pro6000"), "c0", "c1"))
    assert one is not None and not one.in_halves
    assert "It is an OUTAGE (1 prefill, 1 decode groups; one group of a mode)" in one.note()
    bare = contract_change(steps(without_the_door(stack_values("sim-2p2d")), "c0", "c1"))
    assert bare is not None and not bare.door
    assert "(2 prefill, 2 decode groups; one router, no door)" in bare.note()


def test_the_same_contract_or_a_first_up_names_nothing() -> None:
    values = stack_values("sim-2p2d")
    assert contract_change(steps(values, "c0", "c0")) is None
    assert contract_change([(None, new) for new in admissions(values, "c1")]) is None


def test_other_commands_among_the_steps_are_read_past() -> None:
    """A node's script with a quote of its own (shlex cannot split it), or none at all: not an
    admission, and the change is still named (kimipd preview once failed on such a step)."""
    others = [({"create": "echo 'it''s"}, {"create": "echo \"it's"}), (None, {"image": "x"})]
    change = contract_change([*others, *steps(stack_values("sim-2p2d"), "c0", "c1")])
    assert change is not None and change.new == "c1"


class PreviewingStack:
    """An Automation API stack whose preview reports the admissions' steps."""

    def __init__(self, reported: list[tuple[dict, dict]]) -> None:
        self.reported = reported
        self.config = {"kimipd:nodes": auto.ConfigValue(value="[]")}

    def get_all_config(self) -> dict:
        return self.config

    def preview(self, on_event=None, exclude=None, diff=False, on_output=None,
                policy_packs=None, policy_pack_configs=None) -> None:
        def state(inputs: dict) -> auto.StepEventStateMetadata:
            return auto.StepEventStateMetadata(type="command:remote:Command", urn="u", id="",
                                               parent="", provider="", inputs=inputs)
        for old, new in self.reported:
            on_event(auto.EngineEvent(sequence=1, timestamp=0, resource_pre_event=(
                auto.ResourcePreEvent(metadata=auto.StepEventMetadata(
                    op=auto.OpType.UPDATE, urn="urn:x::decode-a-admit", type="", provider="",
                    old=state(old), new=state(new))))))


class Engine:
    def __init__(self, stack: PreviewingStack) -> None:
        self.stack = stack

    def policy(self) -> nullcontext[PolicyRun]:
        return nullcontext(PolicyRun(packs=[], configs=[]))


def test_kimipd_preview_names_the_change_after_the_engine_s_preview() -> None:
    out = io.StringIO()
    stack = PreviewingStack(steps(copy.deepcopy(stack_values("pro6000")), "c0", "c1"))
    assert OutUpdate(Engine(stack), out).preview(diff=False) == 0  # type: ignore[arg-type]
    assert "changes the serving contract (c0 -> c1" in out.getvalue()
    assert "It is an OUTAGE" in out.getvalue()
    quiet = io.StringIO()
    same = PreviewingStack(steps(stack_values("pro6000"), "c0", "c0"))
    OutUpdate(Engine(same), quiet).preview(diff=False)  # type: ignore[arg-type]
    assert "serving contract" not in quiet.getvalue()
