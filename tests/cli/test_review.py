"""The review renderer's pure parts: command lines to flags, inputs to changes. Its output on real
previews of the sim stack is checked in test_readme_commands.py."""

from __future__ import annotations

from review.changes import CONTAINER, UNKNOWN, InputChange, argv_flags, input_changes


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
