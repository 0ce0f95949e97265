"""The review renderer's pure parts: command lines to flags, inputs to changes, a change to the KV
contract named. Its output on real previews of the sim stack is checked in
test_readme_commands.py."""

from __future__ import annotations

from review.changes import (
    CONTAINER, UNKNOWN, InputChange, argv_flags, changes, contract_changes, input_changes)
from review.markdown import render


def test_flags_values_repeats_and_positionals() -> None:
    argv = ["bash", "/opt/kimipd/launch.sh", "--wheel", "a.whl", "--wheel", "b.whl", "--",
            "python3", "-m", "sglang.launch_server", "--trust-remote-code", "--tp-size", "32",
            "--host=0.0.0.0"]
    assert argv_flags(argv) == {
        "argv[0]": "bash", "argv[1]": "/opt/kimipd/launch.sh", "--wheel": "a.whl b.whl",
        "argv[2]": "python3", "-m": "sglang.launch_server", "--trust-remote-code": "",
        "--tp-size": "32", "--host": "0.0.0.0"}


def test_container_changes_name_flags_env_and_labels() -> None:
    old = {"command": ["x", "--max-running-requests", "64", "--mem-fraction-static", "0.85"],
           "envs": ["A=1", "B=2"], "labels": [{"label": "kimipd.restart-generation", "value": "0"}],
           "image": "sha256:aaa", "restart": "no", "__defaults": []}
    new = {"command": ["x", "--max-running-requests", "32", "--mem-fraction-static", "0.85",
                       "--enable-metrics"],
           "envs": ["A=1", "C=3"], "labels": [{"label": "kimipd.restart-generation", "value": "1"}],
           "image": UNKNOWN, "restart": "no"}
    assert input_changes(CONTAINER, old, new) == [
        InputChange("flag", "--max-running-requests", "64", "32"),
        InputChange("flag", "--enable-metrics", None, ""),
        InputChange("env", "C", None, "3"),
        InputChange("env", "B", "2", None),
        InputChange("label", "kimipd.restart-generation", "0", "1"),
        InputChange("input", "image", "sha256:aaa", "(known after apply)"),
    ]


def _rank0(group: str, mode: str, old_argv: list[str], new_argv: list[str],
           old_image: str = "sha256:aaa", new_image: str = "sha256:aaa") -> dict:
    """A preview step replacing GROUP's rank 0 from OLD_ARGV to NEW_ARGV."""
    def state(argv: list[str], image: str) -> dict:
        return {"type": CONTAINER, "custom": True, "inputs": {
            "name": f"kimipd-{group}-r0", "image": image,
            "command": ["python3", "-m", "sglang.launch_server", "--disaggregation-mode", mode,
                        *argv],
            "labels": [{"label": "kimipd.role", "value": f"{group}-r0"},
                       {"label": "kimipd.group", "value": group}]}}
    return {"op": "replace", "urn": f"urn:pulumi:s::kimipd::docker:index/container:Container::"
                                    f"node-10-0-0-1-{mode}",
            "oldState": state(old_argv, old_image), "newState": state(new_argv, new_image)}


def test_a_checkpoint_change_on_both_modes_is_named_as_a_contract_change() -> None:
    old, new = ["--model-path", "/m/K3"], ["--model-path", "/m/K3-0912"]
    preview = {"steps": [_rank0("prefill-a", "prefill", old, new),
                         _rank0("decode-a", "decode", old, new)]}
    (changed,) = contract_changes(changes(preview))
    assert changed.what == InputChange("flag", "--model-path", "/m/K3", "/m/K3-0912")
    assert (changed.groups, changed.modes) == (("decode-a", "prefill-a"), ("decode", "prefill"))
    markdown = render(preview)
    assert "#### The KV contract changes" in markdown
    assert "`/m/K3` -> `/m/K3-0912` on `decode-a`, `prefill-a`" in markdown
    # One group of each mode: the old ones leave before the new ones serve.
    assert "**It is an outage** (1 prefill, 1 decode groups; one router" in markdown


def _slot(slot: str) -> dict:
    """A router slot the preview keeps."""
    return {"op": "same", "urn": f"urn:pulumi:s::kimipd::docker:index/container:Container::"
                                 f"router-{slot}",
            "newState": {"type": CONTAINER, "custom": True, "inputs": {
                "labels": [{"label": "kimipd.role", "value": f"router-{slot}"}]}}}


def test_a_checkpoint_change_behind_the_door_with_two_groups_of_each_mode_rolls_in_halves() -> None:
    old, new = ["--model-path", "/m/K3"], ["--model-path", "/m/K3-0912"]
    steps = [_rank0(group, group.split("-")[0], old, new)
             for group in ("prefill-a", "prefill-b", "decode-a", "decode-b")]
    markdown = render({"steps": [*steps, _slot("a"), _slot("b")]})
    assert "**It rolls in halves and never pairs the two contracts** (2 prefill, 2 decode" \
        in markdown
    # The same groups without the door: one router, an outage.
    assert "**It is an outage** (2 prefill, 2 decode groups; one router" in render(
        {"steps": steps})
    # MiniLB: nothing keeps them apart.
    mini = {"steps": [*steps, _slot("a"), _slot("b")]}
    for step in mini["steps"][-2:]:
        step["newState"]["inputs"]["command"] = ["python3", "-m", "sglang_router.launch_router",
                                                 "--mini-lb"]
    assert "**MiniLB does not keep the two contracts apart:**" in render(mini)
    # The door with one group of a mode.
    one = [_rank0("prefill-a", "prefill", old, new), _rank0("decode-a", "decode", old, new)]
    assert "(1 prefill, 1 decode groups; one group of a mode)" in render(
        {"steps": [*one, _slot("a"), _slot("b")]})


def test_an_image_change_is_a_contract_change_and_a_decode_only_flag_is_not() -> None:
    args = ["--max-running-requests", "64"]
    preview = {"steps": [_rank0("prefill-a", "prefill", args, args, new_image=UNKNOWN),
                         _rank0("decode-a", "decode", args, args, new_image=UNKNOWN)]}
    (changed,) = contract_changes(changes(preview))
    assert (changed.what.name, changed.what.new) == ("image", "(known after apply)")
    decode_only = {"steps": [_rank0("decode-a", "decode", args,
                                    ["--max-running-requests", "32"])]}
    assert contract_changes(changes(decode_only)) == []
    assert "KV contract" not in render(decode_only)


def test_a_longer_decode_context_is_one_mode_and_rolls_as_any_change() -> None:
    preview = {"steps": [_rank0("decode-a", "decode", ["--context-length", "8192"],
                                ["--context-length", "16384"])]}
    (changed,) = contract_changes(changes(preview))
    assert changed.modes == ("decode",)
    assert "Only the decode groups change" in render(preview)
