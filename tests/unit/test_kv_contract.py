"""The KV contract (components/config/rules/kv_contract.py): every prefill and decode group the
router may pair agree on what crosses the KV hand-off, or the stack is refused before anything is
touched, naming both groups, the flag, both values and the fix."""

from __future__ import annotations

import copy

import pytest

from components.config import ConfigError, load_cluster_config
from components.config.rules.kv_contract import kv_contract
from tests.conftest import stack_values


def refusal(values: dict) -> str:
    with pytest.raises(ConfigError) as error:
        load_cluster_config(values)
    return str(error.value)


def with_args(values: dict, group: str, *args: str) -> dict:
    values = copy.deepcopy(values)
    values["groups"][group]["extraArgs"] = [*values["groups"][group].get("extraArgs", []), *args]
    return values


@pytest.mark.parametrize("stack", ["pro6000", "sim", "sim-2p2d"])
def test_the_shipped_stacks_keep_the_contract(stack: str) -> None:
    cfg = load_cluster_config(stack_values(stack))
    contracts = {name: kv_contract(name, group) for name, group in cfg.groups.items()}
    assert {tuple(setting.value for setting in contract.values())
            for contract in contracts.values()} == {
        (None, None, None, None, None, None, None, None, "mooncake")}


@pytest.mark.parametrize(("group", "args", "flag", "shown"), [
    ("prefill", ("--kv-cache-dtype", "fp8_e4m3"), "--kv-cache-dtype",
     "'fp8_e4m3' (groups.prefill.extraArgs[6]) on prefill and SGLang's default 'auto' on decode"),
    ("decode", ("--page-size", "64"), "--page-size",
     "not set (SGLang's default) on prefill and '64' (groups.decode.extraArgs[4]) on decode"),
    ("decode", ("--dtype=float16",), "--dtype",
     "SGLang's default 'auto' on prefill and 'float16' (groups.decode.extraArgs[4]) on decode"),
    ("prefill", ("--quantization", "fp8"), "--quantization", "'fp8'"),
    ("decode", ("--revision", "0912"), "--revision", "'0912'"),
    ("prefill", ("--tokenizer-path", "/data/tokenizers/other"), "--tokenizer-path",
     "'/data/tokenizers/other'"),
    ("decode", ("--speculative-algorithm", "EAGLE"), "--speculative-algorithm", "'EAGLE'"),
])
def test_a_flag_on_one_mode_only_is_refused_naming_both_groups_and_values(
        pro6000: dict, group: str, args: tuple[str, ...], flag: str, shown: str) -> None:
    message = refusal(with_args(pro6000, group, *args))
    assert f"groups.prefill and groups.decode disagree on the KV hand-off: {flag} is " in message
    assert shown in message, message
    assert "silently wrong" in message and f"set the same {flag} on both groups" in message


def test_the_same_setting_on_both_modes_and_auto_against_nothing_are_accepted(
        pro6000: dict) -> None:
    values = with_args(pro6000, "prefill", "--kv-cache-dtype", "fp8_e4m3", "--page-size", "64")
    values = with_args(values, "decode", "--kv-cache-dtype=fp8_e4m3", "--page-size", "64",
                       "--dtype", "auto")
    load_cluster_config(values)


def test_the_last_occurrence_is_the_one_compared(pro6000: dict) -> None:
    """argparse keeps the last: an earlier, overridden value agrees with nothing."""
    values = with_args(pro6000, "prefill", "--page-size", "16", "--page-size", "64")
    values = with_args(values, "decode", "--page-size", "64")
    load_cluster_config(values)
    message = refusal(with_args(values, "decode", "--page-size", "32"))
    assert "'64' (groups.prefill.extraArgs[8]) on prefill and '32'" in message


def test_a_different_transfer_backend_is_refused(pro6000: dict) -> None:
    values = copy.deepcopy(pro6000)
    values["groups"]["decode"]["transferBackend"] = "nixl"
    message = refusal(values)
    assert ("transferBackend is 'mooncake' (groups.prefill.transferBackend) on prefill and "
            "'nixl' (groups.decode.transferBackend) on decode") in message


def test_decode_may_hold_a_longer_context_never_a_shorter_one(pro6000: dict) -> None:
    load_cluster_config(with_args(with_args(pro6000, "prefill", "--context-length", "65536"),
                                  "decode", "--context-length", "131072"))
    load_cluster_config(with_args(pro6000, "prefill", "--context-length", "32k"))
    shorter = refusal(with_args(with_args(pro6000, "prefill", "--context-length", "128k"),
                                "decode", "--context-length", "65536"))
    assert ("--context-length is '128k' (groups.prefill.extraArgs[6]) on prefill and '65536' "
            "(groups.decode.extraArgs[4]) on decode") in shorter
    assert "give decode a --context-length at least prefill's" in shorter
    only_decode = refusal(with_args(pro6000, "decode", "--context-length", "65536"))
    assert "not set (SGLang's default) on prefill" in only_decode


def test_every_pair_of_a_2p2d_stack_is_checked() -> None:
    values = with_args(stack_values("sim-2p2d"), "decode-b", "--kv-cache-dtype", "fp8_e5m2")
    message = refusal(values)
    assert "groups.prefill-a and groups.decode-b disagree" in message
    assert "groups.prefill-b and groups.decode-b disagree" in message
    assert "decode-a disagree" not in message
