"""Rules that come from what the pinned SGLang and Mooncake accept and need (issue: right the
first time): extraArgs as SGLang's own parser reads them, every rank's --port, PyTorch's newer
allocator variable, exclusion lists, one Mooncake wheel, and the flash_kda warning."""

from __future__ import annotations

import pytest

from components.config import ConfigError, config_warnings, load_cluster_config


def refusal(values: dict) -> str:
    with pytest.raises(ConfigError) as error:
        load_cluster_config(values)
    return str(error.value)


@pytest.mark.parametrize("extra, written, canonical, setter", [
    (["--tp-size", "16"], "--tp-size", "--tp-size", "groups.decode.tpSize"),
    (["--tp=16"], "--tp=16", "--tp-size", "groups.decode.tpSize"),
    (["--tensor-parallel-size", "16"], "--tensor-parallel-size", "--tp-size", "groups.decode.tpSize"),
    (["--expert-parallel-size", "8"], "--expert-parallel-size", "--ep-size", "groups.decode.epSize"),
    (["--nccl-init", "174.1.60.6:20000"], "--nccl-init", "--dist-init-addr", "groups.decode.distInitPort"),
    (["--port", "30001"], "--port", "--port", "groups.decode.httpPort"),
    (["--host=127.0.0.1"], "--host=127.0.0.1", "--host", "nothing: every rank binds 0.0.0.0"),
    (["--disaggregation-mode", "prefill"], "--disaggregation-mode", "--disaggregation-mode", "groups.decode.mode"),
    (["--disaggregation-transfer-backend", "nixl"], "--disaggregation-transfer-backend",
     "--disaggregation-transfer-backend", "groups.decode.transferBackend"),
    (["--model", "/other"], "--model", "--model-path", "model.path"),
])
def test_a_flag_the_program_renders_is_refused_in_extra_args(pro6000, extra, written, canonical,
                                                            setter) -> None:
    pro6000["groups"]["decode"]["extraArgs"] = ["--mem-fraction-static", "0.85", *extra]
    message = refusal(pro6000)
    assert f"groups.decode.extraArgs[2]: {written!r} sets {canonical}" in message
    assert "the last occurrence wins" in message and setter in message


@pytest.mark.parametrize("extra, complaint", [
    (["--enable-ep-moe"], "unrecognized arguments: --enable-ep-moe"),
    (["--kv-cache-dtype", "fp9"], "argument --kv-cache-dtype: invalid choice: 'fp9'"),
    (["--max-running-requests", "many"], "argument --max-running-requests: invalid int value: 'many'"),
    (["--disable"], "ambiguous option: --disable could match"),
    (["--chunked-prefill-size"], "argument --chunked-prefill-size: expected one argument"),
])
def test_what_sglang_would_refuse_is_refused_at_preview(pro6000, extra, complaint) -> None:
    pro6000["groups"]["prefill"]["extraArgs"] = extra
    message = refusal(pro6000)
    assert f"groups.prefill.extraArgs: {extra!r} is refused by sglang 0.5.19's own parser" in message
    assert complaint in message and "exit with status 2 on the node" in message


def test_router_extra_args_go_through_the_routers_parser(pro6000) -> None:
    pro6000["router"]["extraArgs"] = ["--port", "31001", "--polic", "random"]
    message = refusal(pro6000)
    assert "router.extraArgs[0]: '--port' sets --port" in message and "router.port" in message
    assert "router.extraArgs[2]: '--polic' sets --policy" in message


def test_legitimate_extra_args_are_accepted(pro6000) -> None:
    pro6000["groups"]["decode"]["extraArgs"] = [
        "--mem-frac", "0.8", "--max-running-requests=64", "--cuda-graph-bs", "1", "2", "4",
        "--kv-cache-dtype", "fp8_e4m3"]
    # The KV cache's dtype is the KV contract's: prefill writes the pages decode reads.
    pro6000["groups"]["prefill"]["extraArgs"] = [
        *pro6000["groups"]["prefill"].get("extraArgs", []), "--kv-cache-dtype=fp8_e4m3"]
    pro6000["router"]["extraArgs"] = ["--queue-size", "200"]
    load_cluster_config(pro6000)


def test_enable_metrics_is_the_metrics_key_not_an_extra_arg(pro6000) -> None:
    """metrics.enabled also lists the targets; a bare --enable-metrics would serve /metrics that
    prometheusTargets never names."""
    pro6000["groups"]["decode"]["extraArgs"] = ["--enable-metrics"]
    message = refusal(pro6000)
    assert ("groups.decode.extraArgs[0]: '--enable-metrics' sets --enable-metrics" in message
            and "metrics.enabled" in message), message


def test_ranks_above_zero_bind_the_http_port_too(pro6000) -> None:
    """Every rank binds --port (SGLang's dummy health server): the router on a decode rank >= 1
    node collides with it."""
    pro6000["router"]["node"] = "174.1.60.6"
    pro6000["router"]["door"]["nodes"] = ["174.1.60.6", "174.1.60.7"]
    pro6000["router"]["port"] = 30000
    assert "router.port: 30000 on 174.1.60.6 is already used by groups.decode.httpPort" in (
        refusal(pro6000))


def test_pytorchs_newer_allocator_variable_is_checked_too(pro6000) -> None:
    pro6000["groups"]["decode"]["env"] = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert "groups.decode.env.PYTORCH_ALLOC_CONF: 'expandable_segments:True' makes Mooncake" in (
        refusal(pro6000))


def test_an_exclusion_list_for_nccl_is_refused(pro6000) -> None:
    pro6000["container"]["env"] = {"NCCL_SOCKET_IFNAME": "^docker0,lo"}
    assert ("container.env.NCCL_SOCKET_IFNAME: '^docker0,lo' is an exclusion list, which lets "
            "NCCL/GLOO pick any other interface, bond0 included") in refusal(pro6000)


def test_two_mooncake_wheels_are_refused(pro6000) -> None:
    wheel = dict(pro6000["nodeFiles"][2])
    wheel["source"] = wheel["destination"] = "/tmp/mooncake_transfer_engine-0.3.13-cp312-cp312-linux_x86_64.whl"
    pro6000["nodeFiles"].append(wheel)
    assert "nodeFiles: 2 Mooncake wheels" in refusal(pro6000)


def test_a_flash_kda_wheel_no_group_selects_is_a_warning(pro6000) -> None:
    def flash_kda_warnings() -> list[str]:
        return [warning for warning in config_warnings(load_cluster_config(pro6000))
                if "flash_kda" in warning]

    assert flash_kda_warnings() == []  # pro6000's prefill selects it
    pro6000["groups"]["prefill"]["extraArgs"] = ["--mem-fraction-static", "0.85"]
    warnings = flash_kda_warnings()
    assert len(warnings) == 1
    assert warnings[0].startswith("nodeFiles[1]: 'flash_kda-0.0.1-cp312-cp312-linux_x86_64.whl' "
                                  "is installed in every container, but no group selects it")
    assert "--linear-attn-prefill-backend flashkda" in warnings[0]
    for spelling in (["--linear-attn-prefill-backend", "flashkda"],
                     ["--linear-attn-backend=flashkda"], ["--linear-attn-prefill", "flashkda"]):
        pro6000["groups"]["prefill"]["extraArgs"] = spelling
        assert flash_kda_warnings() == [], spelling
