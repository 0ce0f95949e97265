"""How keys are set in the stack file, under Pulumi's mocks: a key under a namespace nothing reads
is a warning at preview, the SSH key in plain text (or a secret the program never reads) is
refused before any resource, and no message ever shows a secret's value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import stack_values
from tests.program.harness import PRIVATE_KEY, run_program, run_refused, with_local_files

pytestmark = pytest.mark.timeout(120)  # the SDK's threads can hang under mocks (pulumi#7663)


@pytest.fixture
def values(tmp_path: Path) -> dict:
    # Two groups of each mode behind the keyed rust router: a stack whose preview warns of
    # nothing else, so the namespace warnings are the only ones.
    values = stack_values("sim-2p2d")
    for node_file in values["nodeFiles"]:
        node_file.pop("sha256")  # with_local_files writes stand-in files
    return with_local_files(values, tmp_path)


def test_a_misspelt_namespace_is_a_warning_and_the_stack_still_deploys(values: dict) -> None:
    run = run_program(values, extra_config={"kimpdi:serving": "false"})
    assert run.warnings == [
        "kimpdi:serving: namespace 'kimpdi' is read by neither this program (kimipd) nor its "
        "providers (command, docker) nor Pulumi, so this key (value 'false') is ignored (did you "
        "mean kimipd:serving?): move it (`pulumi config rm 'kimpdi:serving'`, then `pulumi config "
        "set kimipd:serving ...`) or remove it."]
    # Ignored indeed: serving stays true.
    assert run.stack_outputs["serving"] is True and run.containers()


def test_the_warning_comes_even_when_the_stack_is_refused(values: dict) -> None:
    image = values.pop("image")
    message, run = run_refused(values, extra_config={"kimipd_:image": image})
    assert "image: required key is missing" in message
    assert len(run.warnings) == 1 and run.warnings[0].startswith("kimipd_:image: namespace ")
    assert "did you mean kimipd:image?" in run.warnings[0]
    assert run.resources == []


def test_the_providers_and_pulumis_namespaces_are_not_warned_about(values: dict) -> None:
    run = run_program(values, extra_config={"docker:host": "unix:///var/run/docker.sock",
                                            "command:skipUpdate": "true",
                                            "pulumi:tags": '{"team": "inference"}'})
    assert run.warnings == []


def test_a_secret_under_a_foreign_namespace_is_warned_without_its_value(values: dict) -> None:
    run = run_program(values, extra_secrets={"kimipdd:sshPrivateKey": PRIVATE_KEY})
    assert len(run.warnings) == 1
    assert "kimipdd:sshPrivateKey: namespace 'kimipdd'" in run.warnings[0]
    assert "(value not shown)" in run.warnings[0] and "PRIVATE KEY" not in run.warnings[0]


def test_the_ssh_key_in_plain_text_is_refused_before_any_resource(values: dict) -> None:
    message, run = run_refused(values, private_key_secret=False)
    assert message == (
        "invalid kimipd secrets:\n  sshPrivateKey: set in plain text (value not shown), so the "
        "private key sits unencrypted in Pulumi.<stack>.yaml and in every copy of that file: "
        "remove it (`pulumi config rm sshPrivateKey`) and set it as a secret: `pulumi config set "
        "--secret sshPrivateKey < KEYFILE`.")
    assert run.resources == []


def test_a_misspelt_secret_is_refused_without_its_value(values: dict) -> None:
    message, run = run_refused(values, private_key=None,
                               extra_secrets={"kimipd:sshPrivatekey": PRIVATE_KEY})
    assert "sshPrivatekey: a secret (value not shown) that this program never reads (did you " \
           "mean 'sshPrivateKey'?)" in message
    assert "PRIVATE KEY" not in message and run.resources == []


def test_a_plain_key_set_as_a_secret_is_refused(values: dict) -> None:
    message, run = run_refused(values, extra_secrets={"kimipd:image": values["image"]})
    assert "image: set as a secret (value not shown), but the program reads image as plain " \
           "configuration: set it again without --secret" in message
    assert run.resources == []


def test_no_ssh_key_at_all_means_the_agent(values: dict) -> None:
    run = run_program(values, private_key=None)
    assert run.warnings == [] and run.containers()
