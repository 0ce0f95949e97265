"""The model: every stack file loads, every runbook rule refuses its bad value by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.assets import verify_node_file_sources
from components.config import (
    ClusterConfig,
    ConfigError,
    NodeFileSpec,
    load_cluster_config,
    parse_mooncake_version,
    stack_file_values,
)
from tests.conftest import REPO, STACK_FILES

MOONCAKE_OLD = "/data/wheels/mooncake_transfer_engine_cuda13-0.3.11.post1-cp312-cp312-manylinux_2_28_x86_64.whl"


def refused(values: dict) -> str:
    with pytest.raises(ConfigError) as error:
        load_cluster_config(values)
    return str(error.value)


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=lambda p: p.name)
def test_every_stack_file_in_the_repo_loads(stack_file: Path) -> None:
    config = load_cluster_config(stack_file_values(yaml.safe_load(stack_file.read_text())))
    assert {g.mode for g in config.groups.values()} == {"prefill", "decode"}


def test_pro6000_is_the_runbook_topology(pro6000: dict) -> None:
    config = load_cluster_config(pro6000)
    assert [n.address for n in config.nodes] == [f"174.1.60.{i}" for i in range(1, 9)]
    assert config.groups["prefill"].nodes == [f"174.1.60.{i}" for i in range(1, 5)]
    assert config.groups["decode"].nodes == [f"174.1.60.{i}" for i in range(5, 9)]
    assert (config.groups["prefill"].tp_size, config.groups["prefill"].ep_size) == (32, 32)
    assert (config.router.node, config.router.port) == ("174.1.60.5", 31000)
    assert (config.mooncake_master.node, config.mooncake_master.rpc_port) == ("174.1.60.1", 50051)
    assert config.container.restart == "no" and config.container.privileged is False


def test_pulumi_yaml_declares_model_keys_with_the_models_defaults() -> None:
    declared = yaml.safe_load((REPO / "Pulumi.yaml").read_text())["config"]
    fields = {field.alias: field for field in ClusterConfig.model_fields.values()}
    for key, declaration in declared.items():
        assert key in fields, f"Pulumi.yaml declares {key!r}, which the model does not have"
        if "default" in declaration:
            # Pulumi's schema has no null: "" stands for unset.
            model_default = fields[key].default
            assert declaration["default"] == ("" if model_default is None else model_default), key


# -- the runbook's hard rules ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["decode", "prefill"])
@pytest.mark.parametrize("value", ["expandable_segments:True",
                                   "max_split_size_mb:512,expandable_segments:True",
                                   "expandable_segments : true"])
def test_expandable_segments_is_refused(pro6000: dict, where: str, value: str) -> None:
    pro6000["groups"][where]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": value}
    message = refused(pro6000)
    assert f"groups.{where}.env.PYTORCH_CUDA_ALLOC_CONF" in message
    assert repr(value) in message and "#2511" in message and "remove" in message


def test_expandable_segments_in_container_env_is_refused(pro6000: dict) -> None:
    pro6000["container"]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert "container.env.PYTORCH_CUDA_ALLOC_CONF" in refused(pro6000)


def test_expandable_segments_false_is_allowed(pro6000: dict) -> None:
    pro6000["groups"]["decode"]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    load_cluster_config(pro6000)


def test_old_mooncake_wheel_is_refused(pro6000: dict) -> None:
    pro6000["nodeFiles"][2] = {"source": MOONCAKE_OLD, "destination": MOONCAKE_OLD}
    message = refused(pro6000)
    assert "nodeFiles[2].destination" in message
    assert "0.3.11.post1" in message and "0.3.12.post1" in message and "#2035" in message


def test_missing_mooncake_wheel_needs_a_declared_image_version(pro6000: dict) -> None:
    del pro6000["nodeFiles"][2]
    assert "no mooncake_transfer_engine" in refused(pro6000)
    pro6000["imageMooncakeVersion"] = "0.3.11.post1"
    assert "imageMooncakeVersion: '0.3.11.post1'" in refused(pro6000)
    pro6000["imageMooncakeVersion"] = "0.3.12.post1"
    load_cluster_config(pro6000)


@pytest.mark.parametrize("version, expected", [
    ("0.3.12.post1", (0, 3, 12, 1)), ("0.3.12", (0, 3, 12, -1)), ("0.3.13", (0, 3, 13, -1))])
def test_mooncake_versions_order(version: str, expected: tuple) -> None:
    assert parse_mooncake_version(version) == expected
    assert parse_mooncake_version("0.3.12") < parse_mooncake_version("0.3.12.post1")


@pytest.mark.parametrize("key", ["ncclSocketInterface", "glooSocketInterface", "computeInterface"])
def test_collectives_on_management_network_are_refused(pro6000: dict, key: str) -> None:
    pro6000["network"][key] = "bond0"
    message = refused(pro6000)
    assert f"network.{key}: 'bond0'" in message and "management" in message


@pytest.mark.parametrize("var", ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])
def test_collectives_env_on_management_network_is_refused(pro6000: dict, var: str) -> None:
    pro6000["groups"]["prefill"]["env"] = {var: "bond0"}
    assert f"groups.prefill.env.{var}: 'bond0'" in refused(pro6000)


def test_nixl_is_refused(pro6000: dict) -> None:
    pro6000["groups"]["decode"]["transferBackend"] = "nixl"
    message = refused(pro6000)
    assert "groups.decode.transferBackend: 'nixl'" in message and "mooncake" in message


def test_transfer_backend_override_in_extra_args_is_refused(pro6000: dict) -> None:
    pro6000["groups"]["prefill"]["extraArgs"] = ["--disaggregation-transfer-backend=nixl"]
    assert "groups.prefill.extraArgs[0]" in refused(pro6000)


# -- shape of the groups -----------------------------------------------------------------------


def test_tp_must_span_the_groups_gpus(pro6000: dict) -> None:
    pro6000["groups"]["prefill"]["tpSize"] = 16
    message = refused(pro6000)
    assert "groups.prefill.tpSize: 16" in message and "set tpSize to 32" in message


def test_ep_above_tp_is_refused(pro6000: dict) -> None:
    pro6000["groups"]["decode"]["epSize"] = 64
    assert "groups.decode.epSize: 64 exceeds tpSize 32" in refused(pro6000)


def test_duplicate_rank_is_refused(pro6000: dict) -> None:
    pro6000["groups"]["decode"]["nodes"][3] = "174.1.60.5"
    assert "groups.decode.nodes[3]: '174.1.60.5' already holds rank 0" in refused(pro6000)


def test_node_in_two_groups_of_one_mode_is_refused(pro6000: dict) -> None:
    pro6000["groups"]["decode2"] = {**pro6000["groups"]["decode"],
                                    "nodes": ["174.1.60.8"], "tpSize": 8, "epSize": 8}
    message = refused(pro6000)
    assert "groups.decode2.nodes[0]: '174.1.60.8' is already in decode group 'decode'" in message


def test_dist_init_host_must_be_the_first_node(pro6000: dict) -> None:
    pro6000["groups"]["prefill"]["distInitHost"] = "174.1.60.2"
    message = refused(pro6000)
    assert "groups.prefill.distInitHost: '174.1.60.2'" in message and "174.1.60.1" in message
    pro6000["groups"]["prefill"]["distInitHost"] = "174.1.60.1"
    load_cluster_config(pro6000)


def test_colliding_ports_on_a_node_are_refused(pro6000: dict) -> None:
    pro6000["router"]["port"] = 30000  # decode rank 0 serves HTTP on .5:30000
    message = refused(pro6000)
    assert "router.port: 30000 on 174.1.60.5 is already used by groups.decode.httpPort" in message


def test_mooncake_master_port_inside_dist_init_range_is_refused(pro6000: dict) -> None:
    pro6000["mooncakeMaster"]["rpcPort"] = 20003  # prefill rank 0 uses dist-init 20000..20007
    assert ("groups.prefill.distInitPort: 20000 makes rank 0 bind 20000-20007 on 174.1.60.1, "
            "and 20003 is already used by mooncakeMaster.rpcPort") in refused(pro6000)


def test_a_prefill_and_a_decode_group_are_required(pro6000: dict) -> None:
    del pro6000["groups"]["decode"]
    assert "no group has mode 'decode'" in refused(pro6000)


# -- what an operator gets wrong ----------------------------------------------------------------


def test_unknown_key_is_refused(pro6000: dict) -> None:
    pro6000["router"]["prot"] = 31000
    message = refused(pro6000)
    assert "router.prot: unknown key (value 31000)" in message


def test_unknown_top_level_key_is_refused(pro6000: dict) -> None:
    pro6000["restartGen"] = 1
    assert "restartGen: unknown key" in refused(pro6000)


@pytest.mark.parametrize("address", ["174.1.60", "node1", "174.1.60.300"])
def test_malformed_address_is_refused(pro6000: dict, address: str) -> None:
    pro6000["nodes"][0]["address"] = address
    message = refused(pro6000)
    assert f"nodes[0].address: {address!r} is not an IPv4 address" in message


def test_undeclared_node_is_refused(pro6000: dict) -> None:
    pro6000["router"]["node"] = "174.1.60.9"
    assert "router.node: '174.1.60.9' is not a declared node" in refused(pro6000)


def test_wrong_type_names_key_and_value(pro6000: dict) -> None:
    pro6000["groups"]["decode"]["tpSize"] = "thirty-two"
    assert "groups.decode.tpSize: 'thirty-two'" in refused(pro6000)


def test_missing_required_key(pro6000: dict) -> None:
    del pro6000["image"]
    assert "image: required key is missing" in refused(pro6000)


def test_minilb_with_a_policy_is_refused(pro6000: dict) -> None:
    pro6000["router"]["kind"] = "mini-lb"
    pro6000["router"]["policy"] = "cache_aware"
    assert "router.policy: 'cache_aware' is ignored by MiniLB" in refused(pro6000)


def test_config_is_frozen(pro6000: dict) -> None:
    config = load_cluster_config(pro6000)
    with pytest.raises(Exception):
        config.serving = False  # type: ignore[misc]


# -- node files on the machine running Pulumi -------------------------------------------------


def test_missing_node_file_is_refused(tmp_path: Path) -> None:
    files = [NodeFileSpec(source=str(tmp_path / "absent.whl"), destination="/tmp/absent.whl")]
    with pytest.raises(ConfigError) as error:
        verify_node_file_sources(files, tmp_path)
    assert f"nodeFiles[0].source: '{tmp_path / 'absent.whl'}' does not exist" in str(error.value)


def test_node_file_checksum_is_verified(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"wheel")
    good = "0b9fe5f48e4e0e0e6e0e5d1f1ec4bb1e1fb4c0e5f1d9c2d0b1a1e9f8c7d6b5a4"
    files = [NodeFileSpec(source=str(wheel), destination="/tmp/w.whl", sha256=good)]
    with pytest.raises(ConfigError) as error:
        verify_node_file_sources(files, tmp_path)
    assert "nodeFiles[0].source" in str(error.value) and f"expects {good!r}" in str(error.value)
    import hashlib
    actual = hashlib.sha256(b"wheel").hexdigest()
    files = [NodeFileSpec(source=str(wheel), destination="/tmp/w.whl", sha256=actual)]
    assert verify_node_file_sources(files, tmp_path) == {"/tmp/w.whl": actual}
