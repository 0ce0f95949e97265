"""The renderers: the exact argv and environment each process of pro6000 gets."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from components.config import load_cluster_config
from components.render import (
    admit_command,
    container_labels,
    container_mounts,
    drain_command,
    mooncake_master_command,
    preflight_command,
    router_command,
    router_plan,
    router_ready_command,
    sglang_command,
    sglang_env,
    smoke_test_command,
    smoke_test_text,
    wait_healthy_command,
)

# installNodeFiles: image (the default): the prepared image holds the node files already.
WRAPPER = ["bash", "/opt/kimipd/launch.sh", "--"]
# installNodeFiles: container-start: launch.sh installs them as the container starts.
INSTALL_AT_START = [
    "bash", "/opt/kimipd/launch.sh",
    "--wheel", "/tmp/flash_kda-0.0.1-cp312-cp312-linux_x86_64.whl",
    "--mooncake-wheel", "/data/flashkda_deploy/wheels/"
               "mooncake_transfer_engine_cuda13-0.3.12.post1-cp312-cp312-manylinux_2_28_x86_64.whl",
    "--wheel", "/data/flashkda_deploy/wheels/"
               "smg-1.13.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "--patch", "/tmp/patch_k3_sm120.py",
    "--require-mooncake", "0.3.12.post1",
    # the rust router's release, proven where the node files are installed
    "--require-module", "smg.launch_router",
    "router.kind rust runs (smg 1.13.0): add smg's wheel to nodeFiles (pip download "
    "smg==1.13.0 --no-deps; docs/router.md)",
    "--",
]


def expected_sglang(mode: str, rank0: str, rank: int, extra: list[str]) -> list[str]:
    return WRAPPER + [
        "python3", "-m", "sglang.launch_server",
        "--model-path", "/data/models/Kimi-K3",
        "--served-model-name", "kimi-k3",
        "--trust-remote-code",
        "--disaggregation-mode", mode,
        "--disaggregation-transfer-backend", "mooncake",
        "--disaggregation-ib-device", "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
        "--disaggregation-bootstrap-port", "8998",
        "--tp-size", "32",
        "--ep-size", "32",
        "--nnodes", "4",
        "--node-rank", str(rank),
        "--dist-init-addr", f"{rank0}:20000",
        "--host", "0.0.0.0",
        "--port", "30000",
        # the router's key, from a root-only file (pro6000 runs the rust router)
        "--config", "/opt/kimipd/keys-31000/sglang.yaml",
        *extra,
    ]


@pytest.mark.parametrize("rank", range(4))
def test_prefill_rank_argv(pro6000: dict, rank: int) -> None:
    config = load_cluster_config(pro6000)
    assert sglang_command(config, "prefill", rank) == expected_sglang(
        "prefill", "174.1.60.1", rank, ["--mem-fraction-static", "0.85",
                                        "--chunked-prefill-size", "16384",
                                        "--linear-attn-prefill-backend", "flashkda"])


@pytest.mark.parametrize("rank", range(4))
def test_decode_rank_argv(pro6000: dict, rank: int) -> None:
    config = load_cluster_config(pro6000)
    assert sglang_command(config, "decode", rank) == expected_sglang(
        "decode", "174.1.60.5", rank, ["--mem-fraction-static", "0.85",
                                       "--max-running-requests", "64"])


@pytest.mark.parametrize("group, rank, address", [
    ("prefill", 0, "174.1.60.1"), ("prefill", 3, "174.1.60.4"),
    ("decode", 0, "174.1.60.5"), ("decode", 3, "174.1.60.8")])
def test_rank_env(pro6000: dict, group: str, rank: int, address: str) -> None:
    assert sglang_env(load_cluster_config(pro6000), group, rank) == {
        "SGLANG_HOST_IP": address,
        "NCCL_SOCKET_IFNAME": "bond1",
        "GLOO_SOCKET_IFNAME": "bond1",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
    }


def test_group_env_and_gid_index_reach_the_rank(pro6000: dict) -> None:
    pro6000["network"]["ibGidIndex"] = 3
    pro6000["groups"]["decode"]["env"] = {"SGLANG_LOG_LEVEL": "debug"}
    env = sglang_env(load_cluster_config(pro6000), "decode", 1)
    assert env["NCCL_IB_GID_INDEX"] == env["MC_GID_INDEX"] == "3"
    assert env["SGLANG_LOG_LEVEL"] == "debug" and env["SGLANG_HOST_IP"] == "174.1.60.6"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env


def test_installing_at_container_start_puts_every_node_file_in_the_argv(pro6000: dict) -> None:
    pro6000["installNodeFiles"] = "container-start"
    config = load_cluster_config(pro6000)
    assert sglang_command(config, "decode", 2)[:len(INSTALL_AT_START) + 3] == [
        *INSTALL_AT_START, "python3", "-m", "sglang.launch_server"]


def test_mooncake_master_argv(pro6000: dict) -> None:
    """launch.sh execs the wheel's binary itself (PID 1), from the node's prepared image."""
    assert mooncake_master_command(load_cluster_config(pro6000)) == [
        *WRAPPER, "mooncake_master", "--rpc_port", "50051", "--rpc_address", "174.1.60.1",
        "--metrics_port", "9003"]


def test_mooncake_master_installing_at_start_gets_only_the_mooncake_wheel(pro6000: dict) -> None:
    """No patch, no flash_kda: a failed patch must not take the metadata service down."""
    pro6000["installNodeFiles"] = "container-start"
    assert mooncake_master_command(load_cluster_config(pro6000)) == [
        "bash", "/opt/kimipd/launch.sh",
        "--mooncake-wheel", "/data/flashkda_deploy/wheels/"
        "mooncake_transfer_engine_cuda13-0.3.12.post1-cp312-cp312-manylinux_2_28_x86_64.whl",
        "--require-mooncake", "0.3.12.post1", "--",
        "mooncake_master", "--rpc_port", "50051", "--rpc_address", "174.1.60.1",
        "--metrics_port", "9003"]


def test_mooncake_master_gets_the_driver_libraries_but_no_gpu(pro6000: dict) -> None:
    from components.render import mooncake_master_plan

    plan = mooncake_master_plan(load_cluster_config(pro6000))
    assert (plan.runtime, plan.gpus, plan.devices) == ("nvidia", None, [])
    assert plan.env["NVIDIA_VISIBLE_DEVICES"] == "none"
    pro6000["mooncakeMaster"]["runtime"] = None
    plan = mooncake_master_plan(load_cluster_config(pro6000))
    assert plan.runtime is None and "NVIDIA_VISIBLE_DEVICES" not in plan.env


def test_minilb_router_argv(pro6000: dict) -> None:
    pro6000["router"]["kind"] = "mini-lb"
    assert router_command(load_cluster_config(pro6000)) == [
        "python3", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--mini-lb",
        "--prefill", "http://174.1.60.1:30000", "8998",
        "--decode", "http://174.1.60.5:30000",
        "--host", "0.0.0.0", "--port", "31000"]


def test_rust_router_argv_has_its_policy(pro6000: dict) -> None:
    pro6000["router"] |= {"kind": "rust", "policy": "round_robin"}
    argv = router_command(load_cluster_config(pro6000))
    assert "--mini-lb" not in argv
    assert argv[4:6] == ["--policy", "round_robin"]


def test_rust_router_argv_names_no_worker_and_bounds_a_request(pro6000: dict) -> None:
    pro6000["router"] |= {"kind": "rust", "policy": "round_robin", "decodePolicy": "round_robin"}
    cfg = load_cluster_config(pro6000)
    argv = router_command(cfg)
    assert "--prefill" not in argv and "--decode" not in argv
    flags = dict(zip(argv[4::2], argv[5::2]))
    assert flags["--decode-policy"] == "round_robin"
    assert (flags["--request-timeout-secs"], flags["--retry-max-retries"]) == ("600", "3")
    assert (flags["--health-check-interval-secs"], flags["--health-failure-threshold"]) == ("5", "2")
    assert (flags["--cb-timeout-duration-secs"], flags["--health-check-timeout-secs"]) == ("5", "5")
    assert (flags["--prometheus-port"], flags["--prometheus-host"]) == ("29000", "0.0.0.0")
    # The container runs the same argv behind router-launch.py, which reads the key file.
    command = router_plan(cfg).command
    launcher = command.index("/opt/kimipd/router-launch.py")
    assert command[launcher + 1:launcher + 4] == ["--api-key-file", "/opt/kimipd/router-31000/api-key",
                                                  "--"]
    assert command[launcher + 4:] == argv[3:]
    assert "--header-file /opt/kimipd/router-31000/auth-header" in smoke_test_command(cfg)


def test_membership_commands_run_on_the_router_node_with_the_rollout(pro6000: dict) -> None:
    pro6000["router"] |= {"kind": "rust"}
    cfg = load_cluster_config(pro6000)
    drain = drain_command(cfg, "decode")
    assert drain.startswith("python3 /opt/kimipd/router-members.py drain ")
    assert "--url http://174.1.60.5:30000 --rollout one-group-at-a-time --drain-timeout 600" in drain
    # As long as SGLang's /health may take (its 1 s and SGLANG_HEALTH_CHECK_TIMEOUT, 20 s).
    assert drain.endswith("--health-seconds 21")
    pro6000["groups"]["decode"]["env"] = {"SGLANG_HEALTH_CHECK_TIMEOUT": "60"}
    assert drain_command(load_cluster_config(pro6000), "decode").endswith("--health-seconds 61")
    assert "--bootstrap-port 8998" in admit_command(cfg, "prefill", "c0")
    assert "--bootstrap-port" not in admit_command(cfg, "decode", "c0")
    ready = router_ready_command(cfg)
    assert "--expect http://174.1.60.1:30000 --expect http://174.1.60.5:30000" in ready


def test_labels_carry_role_and_generation(pro6000: dict) -> None:
    pro6000["restartGeneration"] = 7
    assert container_labels(load_cluster_config(pro6000), "decode-r2") == {
        "kimipd.role": "decode-r2", "kimipd.restart-generation": "7"}


def test_mounts_scripts_node_files_and_volumes(pro6000: dict) -> None:
    mounts = container_mounts(load_cluster_config(pro6000))
    assert mounts[0] == ("/opt/kimipd", "/opt/kimipd", True)
    assert ("/tmp/patch_k3_sm120.py", "/tmp/patch_k3_sm120.py", True) in mounts
    assert mounts[-1] == ("/data/models", "/data/models", True)


def preflight_argv(config, address: str) -> list[str]:
    line, heredoc = preflight_command(config, address, "echo checks\n").split(" <<", 1)
    assert heredoc == "'KIMIPD_PREFLIGHT'\necho checks\nKIMIPD_PREFLIGHT"
    return shlex.split(line)


def test_preflight_line(pro6000: dict) -> None:
    argv = preflight_argv(load_cluster_config(pro6000), "174.1.60.3")
    assert argv == ["bash", "-s", "--", "--node", "174.1.60.3", "--gpus", "8",
                    "--max-gpu-memory-used-mib", "0",
                    "--rdma-devices", "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
                    "--compute-interface", "bond1", "--nvidia-runtime", "yes",
                    "--disk-path", "/var/lib/docker", "--min-free-disk-gb", "200",
                    "--model-host-path", "/data/models/Kimi-K3",
                    "--device-paths", "/dev/infiniband",
                    "--ports", "30000=groups.prefill.httpPort", "--needs-nft", "yes"]


def preflight_flag(config, address: str, flag: str) -> str:
    argv = preflight_argv(config, address)
    return argv[argv.index(flag) + 1]


def test_preflight_ports_are_every_port_the_node_binds(pro6000: dict) -> None:
    config = load_cluster_config(pro6000)
    dist_init = [f"{20000 + n}=groups.prefill.distInitPort{f'+{n}' if n else ''}" for n in range(8)]
    # mc-master + prefill rank 0 (bootstrap server, dist-init..+7, --port).
    assert preflight_flag(config, "174.1.60.1", "--ports").split(",") == [
        "8998=groups.prefill.bootstrapPort", "9003=mooncakeMaster.metricsPort", *dist_init,
        "30000=groups.prefill.httpPort", "50051=mooncakeMaster.rpcPort"]
    # decode rank 0 (no bootstrap server) + a door and router slot a.
    assert preflight_flag(config, "174.1.60.5", "--ports").split(",") == [
        *(entry.replace("prefill", "decode") for entry in dist_init),
        "29001=router.door.slots[0].metricsPort", "29100=router.door.metricsPort",
        "30000=groups.decode.httpPort", "31000=router.port", "31001=router.door.slots[0].port",
        "31101=router.door.slots[0].pairCheckPort"]
    # decode rank 2 + the other door and slot b.
    assert preflight_flag(config, "174.1.60.7", "--ports").split(",") == [
        "29002=router.door.slots[1].metricsPort", "29100=router.door.metricsPort",
        "30000=groups.decode.httpPort", "31000=router.port", "31002=router.door.slots[1].port",
        "31102=router.door.slots[1].pairCheckPort"]
    # A rank >= 1 binds --port too (SGLang's dummy health server).
    assert preflight_flag(config, "174.1.60.8", "--ports") == "30000=groups.decode.httpPort"
    # The door on router.node alone: both slots there.
    pro6000["router"]["door"] = {"image": pro6000["router"]["door"]["image"]}
    assert preflight_flag(load_cluster_config(pro6000), "174.1.60.5", "--ports").split(",")[8:] == [
        "29001=router.door.slots[0].metricsPort", "29002=router.door.slots[1].metricsPort",
        "29100=router.door.metricsPort", "30000=groups.decode.httpPort", "31000=router.port",
        "31001=router.door.slots[0].port", "31002=router.door.slots[1].port",
        "31101=router.door.slots[0].pairCheckPort", "31102=router.door.slots[1].pairCheckPort"]


def test_preflight_model_is_checked_through_the_volume_that_mounts_it(pro6000: dict) -> None:
    def model_host_path(*volumes: tuple[str, str]) -> str:
        pro6000["container"]["volumes"] = [{"hostPath": host, "containerPath": inside}
                                           for host, inside in volumes]
        return preflight_flag(load_cluster_config(pro6000), "174.1.60.3", "--model-host-path")

    # The deepest mount wins, as in the container.
    assert model_host_path(("/mnt/nvme", "/data"),
                           ("/mnt/weights", "/data/models")) == "/mnt/weights/Kimi-K3"
    assert model_host_path(("/mnt/weights/K3", "/data/models/Kimi-K3")) == "/mnt/weights/K3"
    # No volume covers model.path: the image carries the model, nothing to check on the node.
    pro6000["model"]["inImage"] = True
    assert model_host_path(("/data/models-old", "/data/models-old")) == ""


def test_preflight_checks_only_rank_nodes_for_the_model_and_devices(pro6000: dict) -> None:
    pro6000["nodes"].append({"address": "174.1.60.9", "gpus": 0})
    pro6000["router"]["node"] = "174.1.60.9"
    pro6000["router"]["door"] = {"image": pro6000["router"]["door"]["image"]}
    config = load_cluster_config(pro6000)
    assert preflight_flag(config, "174.1.60.9", "--model-host-path") == ""
    assert preflight_flag(config, "174.1.60.9", "--device-paths") == ""
    assert preflight_flag(config, "174.1.60.9", "--ports") == (
        "29001=router.door.slots[0].metricsPort,29002=router.door.slots[1].metricsPort,"
        "29100=router.door.metricsPort,31000=router.port,31001=router.door.slots[0].port,"
        "31002=router.door.slots[1].port,31101=router.door.slots[0].pairCheckPort,"
        "31102=router.door.slots[1].pairCheckPort")


def test_preflight_checks_can_be_turned_off(pro6000: dict) -> None:
    pro6000["preflight"] |= {"checkGpus": False, "checkRdma": False, "checkModel": False}
    argv = preflight_argv(load_cluster_config(pro6000), "174.1.60.3")
    assert argv[argv.index("--gpus") + 1] == "0"
    assert argv[argv.index("--rdma-devices") + 1] == ""
    assert argv[argv.index("--device-paths") + 1] == ""
    assert argv[argv.index("--model-host-path") + 1] == ""


def test_gate_line(pro6000: dict) -> None:
    from components.render import sglang_rank_plan

    config = load_cluster_config(pro6000)
    argv = shlex.split(wait_healthy_command(config, sglang_rank_plan(config, "decode", 2)))
    assert argv == ["bash", "/opt/kimipd/wait-healthy.sh", "--url",
                    "http://174.1.60.7:30000/health", "--container", "kimipd-decode-r2",
                    "--node", "174.1.60.7", "--timeout", "1800", "--interval", "1"]


def test_smoke_test_posts_the_runbook_body(pro6000: dict) -> None:
    argv = shlex.split(smoke_test_command(load_cluster_config(pro6000)))
    # Through the virtual IP: pro6000 ships the door on two nodes.
    assert argv[argv.index("--url") + 1] == "http://174.1.60.100:31000/generate"
    assert json.loads(argv[argv.index("--body") + 1]) == {
        "text": "Hello", "sampling_params": {"max_new_tokens": 16}}


def test_smoke_test_text() -> None:
    assert smoke_test_text('{"text": " world", "meta_info": {}}') == " world"
    with pytest.raises(ValueError, match="without a 'text' field"):
        smoke_test_text('{"error": "Failed to send kv chunk"}')


def test_container_plans(pro6000: dict) -> None:
    from components.render import mooncake_master_plan, router_plan, sglang_rank_plan

    config = load_cluster_config(pro6000)
    rank0, rank2 = sglang_rank_plan(config, "decode", 0), sglang_rank_plan(config, "decode", 2)
    assert (rank0.node, rank0.name, rank0.health_url) == (
        "174.1.60.5", "kimipd-decode-r0", "http://174.1.60.5:30000/health")
    # Ranks >= 1: SGLang's dummy health server on --port, up once the rank has loaded.
    assert (rank2.node, rank2.health_url) == ("174.1.60.7", "http://174.1.60.7:30000/health")
    assert (rank0.gpus, rank0.devices, rank0.capabilities) == ("all", ["/dev/infiniband"], ["IPC_LOCK"])
    assert rank0.restart == "no" and rank0.privileged is False
    router, master = router_plan(config), mooncake_master_plan(config)
    assert (router.node, router.gpus, router.devices) == ("174.1.60.5", None, [])
    # router.port is the door's; on two door nodes clients reach it on the virtual IP.
    assert router.health_url == "http://174.1.60.100:31000/health"
    assert (master.node, master.health_url) == ("174.1.60.1", "http://174.1.60.1:9003/health")


# -- the bootstrap gate (startOrder: overlapped) ------------------------------------------------

import http.server  # noqa: E402 (this section's own imports)
import socket  # noqa: E402
import subprocess  # noqa: E402
from collections.abc import Iterator  # noqa: E402

from tests import fake_servers  # noqa: E402
from tests.conftest import REPO  # noqa: E402


def test_bootstrap_gate_line(pro6000: dict) -> None:
    from components.render import wait_bootstrap_command

    argv = shlex.split(wait_bootstrap_command(load_cluster_config(pro6000), "prefill"))
    assert argv == ["bash", "/opt/kimipd/wait-healthy.sh", "--url",
                    "http://174.1.60.1:8998/health", "--any-status",
                    "--container", "kimipd-prefill-r0", "--node", "174.1.60.1",
                    "--timeout", "1800", "--interval", "0.5"]


def test_gate_intervals_take_fractions_and_the_bootstrap_gate_polls_at_least_every_half_second(
        pro6000: dict) -> None:
    from components.config import ConfigError
    from components.render import sglang_rank_plan, wait_bootstrap_command

    def intervals(value: float) -> tuple[str, str]:
        config = load_cluster_config(pro6000 | {"gates": {"intervalSeconds": value}})
        health = shlex.split(wait_healthy_command(config, sglang_rank_plan(config, "decode", 0)))
        bootstrap = shlex.split(wait_bootstrap_command(config, "prefill"))
        return health[health.index("--interval") + 1], bootstrap[bootstrap.index("--interval") + 1]

    assert intervals(0.25) == ("0.25", "0.25")
    assert intervals(10) == ("10", "0.5")
    for wrong in (0, 0.05, 61):
        with pytest.raises(ConfigError, match="gates.intervalSeconds"):
            intervals(wrong)


def test_start_order_defaults_to_sequential_and_refuses_other_words(pro6000: dict) -> None:
    from components.config import ConfigError

    assert load_cluster_config(pro6000).start_order == "sequential"
    pro6000["startOrder"] = "parallel"
    with pytest.raises(ConfigError, match="startOrder: 'parallel' is not one of 'sequential' "
                                          "or 'overlapped'"):
        load_cluster_config(pro6000)


@pytest.fixture
def answering_404() -> Iterator[str]:
    """A loopback HTTP server that answers every GET with 404."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake_servers.serve(server)
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    fake_servers.stop(server)


def _wait_healthy(tmp_path, state: str, *args: str) -> subprocess.CompletedProcess:
    """assets/wait-healthy.sh with a `docker` on PATH that reports STATE."""
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\ncase "$1" in inspect) echo "{state}" ;; '
                      'logs) echo "bootstrap server never started" ;; esac\n')
    docker.chmod(0o755)
    return subprocess.run(["bash", str(REPO / "assets" / "wait-healthy.sh"), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})


def test_any_status_passes_on_any_http_answer(answering_404: str, tmp_path) -> None:
    result = _wait_healthy(tmp_path, "running (exit code 0)", "--url", answering_404,
                           "--any-status", "--container", "kimipd-prefill-r0",
                           "--timeout", "10", "--interval", "1")
    assert result.returncode == 0, result.stderr
    # The first poll answers; bash's SECONDS counts wall-clock seconds, so a second boundary
    # crossed during it reads 1.
    assert re.search(r"kimipd-prefill-r0: answering after [01]s", result.stdout), result.stdout
    assert "HTTP 404" in result.stdout
    # Without the option a 404 is not ready.
    result = _wait_healthy(tmp_path, "running (exit code 0)", "--url", answering_404,
                           "--container", "kimipd-prefill-r0", "--timeout", "1", "--interval", "1")
    assert result.returncode == 1 and "not healthy after" in result.stderr
    assert "answered 404" in result.stderr


def test_a_bootstrap_port_that_never_opens_is_not_answering(tmp_path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    result = _wait_healthy(tmp_path, "running (exit code 0)", "--url",
                           f"http://127.0.0.1:{port}/health", "--any-status",
                           "--container", "kimipd-prefill-r0", "--node", "174.1.60.1",
                           "--timeout", "1", "--interval", "0.5")
    assert result.returncode == 1
    # It gives up once its timeout is past, naming how long it really waited (a poll on a
    # loaded machine may end after the timeout: the line reports the time, not the setting).
    found = re.search(r"kimipd-prefill-r0 on 174\.1\.60\.1: not answering after (\d+)s ",
                      result.stderr)
    assert found and int(found.group(1)) >= 1 and "answered 000" in result.stderr, result.stderr


def test_any_status_still_fails_at_once_when_the_container_stops(tmp_path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens once the socket is closed
    result = _wait_healthy(tmp_path, "exited (exit code 1)", "--url",
                           f"http://127.0.0.1:{port}/health", "--any-status",
                           "--container", "kimipd-prefill-r0", "--node", "174.1.60.1",
                           "--timeout", "30", "--interval", "1")
    assert result.returncode == 1
    assert "kimipd-prefill-r0 on 174.1.60.1: not running: exited (exit code 1)" in result.stderr
    assert "  | bootstrap server never started" in result.stderr


# -- the prepared image --------------------------------------------------------------------------

BASE = "sha256:" + "b" * 64
SCRIPTS = {"launch.sh": "#!/bin/bash\n", "prepare-image.sh": "#!/bin/bash\n"}


def _digests(config) -> dict[str, str]:
    return {f.destination: "0" * 64 for f in config.node_files}


def test_prepared_image_tag_names_every_input(pro6000: dict) -> None:
    from components.render import prepared_image_tag

    config = load_cluster_config(pro6000)
    digests = _digests(config)
    tag = prepared_image_tag(config, BASE, digests, SCRIPTS)
    assert tag.startswith("kimipd/prepared:") and tag == prepared_image_tag(
        config, BASE, dict(digests), dict(SCRIPTS))
    a_wheel = next(f.destination for f in config.node_files if f.is_wheel)
    changed = [
        prepared_image_tag(config, "sha256:" + "c" * 64, digests, SCRIPTS),
        prepared_image_tag(config, BASE, digests | {a_wheel: "1" * 64}, SCRIPTS),
        prepared_image_tag(config, BASE, digests, SCRIPTS | {"launch.sh": "#!/bin/sh\n"}),
    ]
    pro6000["nodeFiles"] = [f for f in pro6000["nodeFiles"] if "patch" not in f["destination"]]
    fewer_files = load_cluster_config(pro6000)
    changed.append(prepared_image_tag(fewer_files, BASE, _digests(fewer_files), SCRIPTS))
    assert len({tag, *changed}) == 5
    # A script the image does not carry (the router's, the door's) leaves every rank as it is.
    assert prepared_image_tag(config, BASE, digests, SCRIPTS | {"door-slots.py": "x"}) == tag


def test_prepare_image_command_installs_what_launch_sh_would_at_start(pro6000: dict) -> None:
    from components.render import prepare_image_command

    config = load_cluster_config(pro6000)
    digests = {f.destination: str(i) * 64 for i, f in enumerate(config.node_files)}
    argv = shlex.split(prepare_image_command(config, "174.1.60.3", BASE, "kimipd/prepared:abc",
                                             "pro6000", digests))
    checks = [arg for f in config.node_files for arg in ("--sha256", f.destination,
                                                         digests[f.destination])]
    assert argv == [
        "bash", "/opt/kimipd/prepare-image.sh", "--node", "174.1.60.3", "--base", BASE,
        "--tag", "kimipd/prepared:abc", "--stack", "pro6000", *checks, "--",
        *INSTALL_AT_START[2:-1]]


def test_prepared_image_id_is_the_last_line_or_an_error() -> None:
    from components.render import prepared_image_id

    assert prepared_image_id("Step 1/4\nok\nsha256:" + "a" * 64 + "\n") == "sha256:" + "a" * 64
    with pytest.raises(ValueError, match="printed no image id"):
        prepared_image_id("Step 1/4 : FROM x\n")


# -- per-group restart and metrics ---------------------------------------------------------------


def test_a_groups_restart_generation_labels_only_its_ranks(pro6000: dict) -> None:
    from components.render import mooncake_master_plan, router_plan, sglang_rank_plan

    def labels(values: dict) -> dict[str, dict[str, str]]:
        config = load_cluster_config(values)
        plans = [mooncake_master_plan(config), router_plan(config)] + [
            sglang_rank_plan(config, name, rank)
            for name, group in config.groups.items() for rank in range(len(group.nodes))]
        return {plan.role: plan.labels for plan in plans}

    before = labels(pro6000)
    assert before["decode-r2"]["kimipd.group"] == "decode"
    assert before["decode-r2"]["kimipd.group-restart-generation"] == "0"
    assert "kimipd.group" not in before["router"]
    pro6000["groups"]["decode"]["restartGeneration"] = 1
    after = labels(pro6000)
    changed = sorted(role for role in before if before[role] != after[role])
    assert changed == ["decode-r0", "decode-r1", "decode-r2", "decode-r3"]


def test_metrics_render_the_flag_and_every_target(pro6000: dict) -> None:
    from components.render import prometheus_targets

    config = load_cluster_config(pro6000)
    assert "--enable-metrics" not in sglang_command(config, "prefill", 0)
    assert prometheus_targets(config, "pro6000") == []
    pro6000["metrics"] = {"enabled": True}
    config = load_cluster_config(pro6000)
    assert all("--enable-metrics" in sglang_command(config, name, rank)
               for name in ("prefill", "decode") for rank in range(4))
    targets = prometheus_targets(config, "pro6000")
    assert targets[0] == {"targets": ["174.1.60.1:9003"],
                          "labels": {"stack": "pro6000", "role": "mooncake-master",
                                     "node": "174.1.60.1"}}
    assert targets[6] == {"targets": ["174.1.60.6:30000"],
                          "labels": {"stack": "pro6000", "role": "decode-r1", "group": "decode",
                                     "mode": "decode", "rank": "1", "node": "174.1.60.6"}}
    # 8 ranks, the master, each door node's exporter and the slot running there
    assert len(targets) == 13
    assert sorted(t["targets"][0] for t in targets
                  if t["labels"]["role"] in ("door", "router")) == [
        "174.1.60.5:29001", "174.1.60.5:29100", "174.1.60.7:29002", "174.1.60.7:29100"]
    json.dumps(targets)  # a file_sd document as it stands
