"""The policy pack on ops' updates (ops/policy_pack.py): told the stack's management interface,
named by every heal's `up`, its refusals read as the heal's failures, and its missing virtualenv
refused with the command that makes it. The pack's own refusals on a real stack: the engine
tests (test_heal_decisions) and test_readme_commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pulumi import automation as auto

from ops import cli
from ops.heal_policy import REFUSED
from ops.policy_pack import (POLICY_VENV_COMMAND, PolicyPackMissing, pack_config, policy_run,
                             stack_policy_file)
from ops.stack import StackError
from ops.stack_engine import StackEngine, failures_from_events

URN = ("urn:pulumi:sim::kimipd::kimipd:cluster:Cluster$docker:index/container:Container::"
       "kimipd-decode-r1")


def made_pack(tmp_path: Path) -> Path:
    pack = tmp_path / "policy"
    (pack / "venv" / "bin").mkdir(parents=True)
    (pack / "venv" / "bin" / "python").write_text("")
    return pack


def test_the_pack_is_told_the_stack_s_management_interface() -> None:
    assert pack_config({"network": {"managementInterface": "eno1"}}) == {
        "kimipd-nccl-off-management": {"managementInterface": "eno1"}}
    assert pack_config({}) == {"kimipd-nccl-off-management": {"managementInterface": "bond0"}}
    with pytest.raises(StackError, match="kimipd:network"):
        pack_config({"network": {"managementInterface": ["not", "a", "name"]}})


def test_the_config_file_lives_as_long_as_the_update(tmp_path: Path) -> None:
    pack = made_pack(tmp_path)
    with policy_run({"network": {"managementInterface": "eno1"}}, pack) as run:
        assert run.packs == [str(pack)]
        (config,) = run.configs
        assert json.loads(Path(config).read_text()) == pack_config(
            {"network": {"managementInterface": "eno1"}})
    assert not Path(config).exists()


def test_a_pack_without_its_virtualenv_is_refused_with_the_command_that_makes_it(
        tmp_path: Path) -> None:
    with pytest.raises(PolicyPackMissing) as refused:
        with policy_run({}, tmp_path / "policy"):
            pytest.fail("ran without the pack")
    assert POLICY_VENV_COMMAND in str(refused.value)
    assert str(tmp_path / "policy" / "venv") in str(refused.value)


def test_reconcile_refuses_to_start_without_the_pack(
        tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("ops.policy_pack.POLICY_PACK", tmp_path / "policy")
    assert cli.main(["reconcile", "-s", "sim", "--state-file", str(tmp_path / "m.json"),
                     "--outputs-json", str(tmp_path / "none.json")]) == REFUSED
    assert POLICY_VENV_COMMAND in capsys.readouterr().err


def policy_violation(level: str) -> auto.EngineEvent:
    return auto.EngineEvent(sequence=1, timestamp=0, policy_event=auto.PolicyEvent(
        message="kimipd-decode-r1: privileged container; run it unprivileged.", color="never",
        policy_name="kimipd-no-privileged", policy_pack_name="kimipd",
        policy_pack_version="0.0.1", policy_pack_version_tag="0.0.1",
        enforcement_level=level, resource_urn=URN))


def test_a_mandatory_violation_is_a_failure_named_by_its_policy_and_an_advisory_one_is_not(
) -> None:
    assert failures_from_events([policy_violation("mandatory"), policy_violation("advisory")]) == [
        {"resource": "kimipd-decode-r1", "type": "docker:index/container:Container",
         "error": "policy kimipd-no-privileged (mandatory): kimipd-decode-r1: privileged "
                  "container; run it unprivileged."}]


def test_every_heal_s_up_names_the_pack_with_the_stack_s_config(tmp_path: Path,
                                                                 monkeypatch) -> None:
    monkeypatch.setattr("ops.policy_pack.POLICY_PACK", made_pack(tmp_path))
    seen: dict[str, object] = {}

    class Stack:
        def get_all_config(self) -> dict:
            return {"kimipd:network": auto.ConfigValue(value='{"managementInterface": "eno1"}'),
                    "kimipd:sshPrivateKey": auto.ConfigValue(value="KEY", secret=True)}

        def refresh(self, **_) -> None:
            pass

        def up(self, policy_packs=None, policy_pack_configs=None, **_):
            seen["packs"] = policy_packs
            seen["config"] = json.loads(Path(policy_pack_configs[0]).read_text())

            class Result:
                class summary:  # noqa: N801 - the Automation API's attribute
                    resource_changes = {"replace": 1}
            return Result()

        name = "sim"

    engine = StackEngine.__new__(StackEngine)
    engine.stack, engine.on_event, engine.project_dir = Stack(), None, tmp_path
    assert engine.heal("kimipd reconcile: heal decode-b") == {"replace": 1}
    assert seen == {"packs": [str(tmp_path / "policy")],
                    "config": {"kimipd-nccl-off-management": {"managementInterface": "eno1"}}}
    # The operator's own settings for this stack (beside its stack file) add to and override it.
    (tmp_path / "Pulumi.sim.policy.json").write_text(json.dumps(
        {"kimipd-nccl-off-management": {"managementInterface": "bond1"},
         "kimipd-no-privileged": {"allowPrivileged": True}}))
    engine.heal("kimipd reconcile: heal decode-b")
    assert seen["config"] == {"kimipd-nccl-off-management": {"managementInterface": "bond1"},
                              "kimipd-no-privileged": {"allowPrivileged": True}}


def test_an_operator_file_that_is_not_a_pack_config_is_refused_by_name(tmp_path: Path) -> None:
    pack = made_pack(tmp_path)
    for text in ("not json", '["a list"]', '{"kimipd-no-privileged": true}'):
        (tmp_path / "Pulumi.sim.policy.json").write_text(text)
        with pytest.raises(StackError, match="Pulumi.sim.policy.json"):
            with policy_run({}, pack, stack_policy_file(tmp_path, "sim")):
                pytest.fail("ran with a broken operator file")
