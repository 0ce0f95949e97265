"""Contract: what the program renders is what the pinned SGLang and sglang-router accept.

Every argv of every stack file in the repository (and of the edits below) goes through the real
parsers of the releases in components/versions.py, installed `--no-deps` in their own cached venv
(scripts/setup-real-sglang, run by scripts/test before pytest). The parse must succeed, and the
values the real parser ends up with must be the ones the model says: a rendered flag that a later
one silently overrides fails here too.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from components import versions
from components.cli_spec import router_table, sglang_table
from components.config import ClusterConfig, load_cluster_config
from components.render import router_command, sglang_launch_args, worker_key_yaml
from tests.conftest import REPO, STACK_FILES, stack_values

UPSTREAM = REPO / "sim" / "standin" / "sglang_standin" / "upstream.py"
LAUNCHER_WORDS = 3  # `python3 -m sglang.launch_server` / `python3 -m smg.launch_router`


@pytest.fixture(scope="module")
def real_python() -> Path:
    venv = os.environ.get("KIMIPD_REAL_SGLANG_VENV")
    assert venv, ("KIMIPD_REAL_SGLANG_VENV is unset: run the tests through scripts/test, or "
                  "export KIMIPD_REAL_SGLANG_VENV=$(scripts/setup-real-sglang)")
    python = Path(venv) / "bin" / "python"
    assert python.exists(), f"{python} is missing: run scripts/setup-real-sglang"
    return python


def real_parse(python: Path, requests: list[dict[str, Any]],
               imports: str = "lean") -> list[dict[str, Any]]:
    # cwd outside the repo: the stand-in's `sglang` shim must not shadow the real package.
    result = subprocess.run([str(python), str(UPSTREAM), "parse-many"], cwd="/tmp",
                            input=json.dumps(requests), capture_output=True, text=True,
                            timeout=300, check=True,
                            env={**os.environ, "SGLANG_STANDIN_PARSER_IMPORTS": imports})
    return json.loads(result.stdout)


def real_options(python: Path, flag: list[str], imports: str = "lean") -> dict[str, Any]:
    return json.loads(subprocess.run(
        [str(python), str(UPSTREAM), "options", *flag], cwd="/tmp", capture_output=True,
        text=True, timeout=300, check=True,
        env={**os.environ, "SGLANG_STANDIN_PARSER_IMPORTS": imports}).stdout)


def edited_stacks() -> dict[str, ClusterConfig]:
    """Every stack file, plus the edits the other tests make to them."""
    stacks = {path.name: load_cluster_config(stack_values(path.name[7:-5])) for path in STACK_FILES}
    pro6000 = stack_values("pro6000")
    edits = {
        "decode-only edit": lambda v: v["groups"]["decode"].update(
            extraArgs=["--mem-fraction-static", "0.8", "--max-running-requests", "32"]),
        "rust router, round robin": lambda v: v["router"].update(
            kind="rust", policy="round_robin", decodePolicy="round_robin",
            prefillPolicy="cache_aware", extraArgs=["--cb-failure-threshold", "20"]),
        "flashkda selected, abbreviations": lambda v: v["groups"]["prefill"].update(
            extraArgs=["--linear-attn-prefill-backend=flashkda", "--mem-frac", "0.85"]),
        "gid index and other ports": lambda v: (v["network"].update(ibGidIndex=3),
                                                v["groups"]["decode"].update(httpPort=30001)),
        "no served model name": lambda v: v["model"].pop("servedModelName"),
    }
    for label, edit in edits.items():
        values = copy.deepcopy(pro6000)
        edit(values)
        stacks[f"pro6000 + {label}"] = load_cluster_config(values)
    return stacks


STACKS = edited_stacks()


# The servers' key file as the program writes it on a node, here in a file of the tests' own:
# the real parser reads it (SGLang's --config merge), so its format is held to the contract too.
CONTRACT_KEY, CONTRACT_ADMIN_KEY = 'contract-key:#"', "contract-admin-key 'x'"
KEY_FILE = Path(tempfile.mkdtemp(prefix="kimipd-contract-")) / "sglang.yaml"
KEY_FILE.write_text(worker_key_yaml(CONTRACT_KEY, CONTRACT_ADMIN_KEY))
atexit.register(shutil.rmtree, KEY_FILE.parent, True)


def server_argv(cfg: ClusterConfig, name: str, rank: int) -> list[str]:
    argv = sglang_launch_args(cfg, name, rank)[LAUNCHER_WORDS:]
    if "--config" in argv:
        argv[argv.index("--config") + 1] = str(KEY_FILE)
    return argv


def rendered_requests(cfg: ClusterConfig) -> list[dict[str, Any]]:
    requests = [{"kind": "server", "argv": server_argv(cfg, name, rank),
                 "group": name, "rank": rank}
                for name, group in cfg.groups.items() for rank in range(len(group.nodes))]
    # MiniLB is sglang-router's; the rust router is smg's.
    requests.append({"kind": "router" if cfg.router.kind == "mini-lb" else "smg",
                     "argv": router_command(cfg)[LAUNCHER_WORDS:]})
    return requests


def expected_server_values(cfg: ClusterConfig, name: str, rank: int) -> dict[str, Any]:
    group = cfg.groups[name]
    return {
        "model_path": cfg.model.path,
        "served_model_name": cfg.model.served_model_name,
        "disaggregation_mode": group.mode,
        "disaggregation_transfer_backend": group.transfer_backend,
        "disaggregation_bootstrap_port": group.bootstrap_port,
        "disaggregation_ib_device": ",".join(cfg.network.rdma_devices),
        "tp_size": group.tp_size,
        "ep_size": group.ep_size,
        "nnodes": len(group.nodes),
        "node_rank": rank,
        "dist_init_addr": f"{group.rank0}:{group.dist_init_port}",
        "host": "0.0.0.0",
        "port": group.http_port,
        # the router's key with the rust router (from the file), none with MiniLB
        "api_key": CONTRACT_KEY if cfg.workers_keyed else None,
        # the admin routes' own key (adminApiKey), from the same file
        "admin_api_key": CONTRACT_ADMIN_KEY if cfg.workers_keyed else None,
    }


def expected_router_values(cfg: ClusterConfig) -> dict[str, Any]:
    router = cfg.router
    common = {"pd_disaggregation": True, "host": router.host, "port": router.port}
    if router.kind == "mini-lb":
        return common | {
            "mini_lb": True,
            "prefill": [[f"http://{g.rank0}:{g.http_port}", str(g.bootstrap_port)]
                        for g in cfg.groups_in_mode("prefill").values()],
            "decode": [[f"http://{g.rank0}:{g.http_port}"]
                       for g in cfg.groups_in_mode("decode").values()],
        }
    # The rust router starts with no workers: each group's Membership admits it.
    return common | {
        "prefill": None, "decode": None,
        "policy": router.policy,
        "prefill_policy": router.prefill_policy,
        "decode_policy": router.decode_policy,
        "request_timeout_secs": router.request_timeout_seconds,
        "retry_max_retries": router.retry_max_retries,
        "health_check_interval_secs": router.health_check_interval_seconds,
        "health_failure_threshold": router.health_failure_threshold,
        "health_check_timeout_secs": router.health_check_timeout_seconds,
        "cb_timeout_duration_secs": router.circuit_breaker_timeout_seconds,
        "prometheus_port": router.metrics_port,
        "prometheus_host": "0.0.0.0",
        "shutdown_grace_period_secs": router.drain_timeout_seconds,
        # smg's changed defaults, set on purpose (components/render/router.py)
        "worker_startup_check_interval": 1,
        "max_concurrent_requests": router.max_concurrent_requests,
        "header_read_timeout_secs": 30,
        "idle_connection_timeout_secs": 90,
        "disable_worker_overload_protection": not router.worker_overload_protection,
    }


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_rendered_argv_parses_to_the_models_values(real_python: Path, stack: str) -> None:
    cfg = STACKS[stack]
    requests = rendered_requests(cfg)
    for request, answer in zip(requests, real_parse(real_python, requests), strict=True):
        where = (f"{stack}: {request.get('group', 'router')} rank {request.get('rank', 0)}: "
                 f"{' '.join(request['argv'])}")
        assert answer["ok"], f"{where}\n  refused: {answer['error']}"
        assert answer["versions"] == {"sglang": versions.SGLANG,
                                      "sglang-router": versions.SGLANG_ROUTER,
                                      "smg": versions.SMG}
        if request["kind"] == "server":
            expected = expected_server_values(cfg, request["group"], request["rank"])
        else:
            expected = expected_router_values(cfg)
        differs = {key: (answer["values"].get(key), value) for key, value in expected.items()
                   if answer["values"].get(key) != value}
        assert not differs, f"{where}\n  parsed (got, want): {differs}"


def test_a_wrong_flag_or_value_fails_the_contract(real_python: Path) -> None:
    """The check has teeth: a renderer that emitted these would fail the test above."""
    cfg = STACKS["Pulumi.pro6000.yaml"]
    decode = cfg.groups["decode"]
    broken = {
        "unknown flag": [*decode.extra_args, "--enable-ep-moe"],
        "bad choice": [*decode.extra_args, "--kv-cache-dtype", "fp9"],
        "bad type": [*decode.extra_args, "--max-running-requests", "many"],
    }
    requests = []
    for extra in broken.values():
        wrong = cfg.model_copy(update={"groups": {
            **cfg.groups, "decode": decode.model_copy(update={"extra_args": extra})}})
        requests.append({"kind": "server", "argv": server_argv(wrong, "decode", 0)})
    answers = real_parse(real_python, requests)
    assert [a["ok"] for a in answers] == [False, False, False]
    assert "unrecognized arguments: --enable-ep-moe" in answers[0]["error"]
    assert "invalid choice: 'fp9'" in answers[1]["error"]
    assert "invalid int value: 'many'" in answers[2]["error"]


def test_option_tables_match_the_real_parsers(real_python: Path) -> None:
    """components/cli_tables/ (what preview validates extraArgs with) is the real parsers' own."""
    for table, flag in ((sglang_table(), []), (router_table("mini-lb"), ["--router"]),
                        (router_table("rust"), ["--smg"])):
        dump = real_options(real_python, flag)
        real = {tuple(o["options"]): o for o in dump["options"]}
        committed = {option.options: option for option in table.options}
        assert set(real) == set(committed), (
            f"{table.label}: options differ; run scripts/dump-cli-tables. Only real: "
            f"{sorted(set(real) - set(committed))[:10]}, only committed: "
            f"{sorted(set(committed) - set(real))[:10]}")
        for options, option in committed.items():
            want = real[options]
            got = {"dest": option.dest, "nargs": option.nargs, "takes_value": option.takes_value,
                   "choices": list(option.choices) if option.choices is not None else None,
                   "type": option.type}
            assert got == {key: want[key] for key in got}, f"{table.label} {options[0]}"


def test_lean_imports_change_nothing_the_parser_does(real_python: Path) -> None:
    """The stand-in and these tests stub modules the parser never uses, even where installed.

    With them imported for real (`full`), SGLang's option table and its verdict on every argv
    here, the broken ones included, must be the same.
    """
    for flag in ([], ["--router"], ["--smg"]):
        assert real_options(real_python, flag, "lean") == real_options(real_python, flag, "full")
    requests = [request for cfg in STACKS.values() for request in rendered_requests(cfg)]
    requests += [{"kind": "server", "argv": ["--model-path", "/m", *extra]}
                 for extra in EXTRA_ARGS_CORPUS]
    lean, full = real_parse(real_python, requests, "lean"), real_parse(real_python, requests, "full")
    assert len(lean) == len(requests) > 40
    assert lean == full


# extraArgs an operator might write: preview's verdict must be the real parser's.
EXTRA_ARGS_CORPUS = [
    ["--mem-fraction-static", "0.85"],
    ["--mem-fraction-static=0.85"],
    ["--mem-frac", "0.85"],
    ["--mem-fraction-static", "high"],
    ["--max-running-requests", "64", "--chunked-prefill-size", "16384"],
    ["--kv-cache-dtype", "fp8_e4m3"],
    ["--kv-cache-dtype", "fp8"],
    ["--attention-backend", "flashinfer"],
    ["--attention-backend", "flash"],
    ["--moe-a2a-backend", "deepep"],
    ["--moe-a2a-backend", "mooncake"],
    ["--load-format", "auto"],
    ["--load-format", "safetensor"],
    ["--linear-attn-prefill-backend", "flashkda"],
    ["--linear-attn-backend", "flash_kda"],
    ["--disable-radix-cache"],
    ["--disable"],
    ["--enable-ep-moe"],
    ["--cuda-graph-max-bs", "64"],
    ["--cuda-graph-bs", "1", "2", "4", "8"],
    ["--watchdog-timeout", "600"],
    ["--context-length", "131072", "--enable-metrics"],
    ["--chunked-prefill-size"],
    ["--log-level", "debug"],
]


def test_preview_verdicts_on_extra_args_match_the_real_parser(real_python: Path) -> None:
    table = sglang_table()
    base = ["--model-path", "/data/models/Kimi-K3"]
    answers = real_parse(real_python, [{"kind": "server", "argv": base + extra}
                                       for extra in EXTRA_ARGS_CORPUS])
    disagreements = [
        (extra, table.check(extra), answer["error"])
        for extra, answer in zip(EXTRA_ARGS_CORPUS, answers, strict=True)
        if (table.check(extra) is None) != answer["ok"]
    ]
    assert not disagreements, disagreements
    assert sum(not answer["ok"] for answer in answers) >= 8  # the corpus has teeth both ways


def test_the_page_size_resolves_as_sglangs_own_post_processing(real_python: Path) -> None:
    """config/rules/kv_contract.resolved_page_size against SGLang 0.5.19's own
    `_mla_backend_page_constraints` and `_page_size_default`, for every snapping backend (and
    some that snap nothing) on every backend flag, every page size, and pairs of backends."""
    from components.config.rules.kv_contract import BACKENDS, PAGE_SNAPS, resolved_page_size

    names = [snap[0] for snap in PAGE_SNAPS] + ["fa3", "flashinfer", "triton"]
    cases: list[dict[str, Any]] = []
    for size in (None, 1, 16, 32, 64, 128):
        cases += [{"page_size": size, flag: name} for flag in BACKENDS for name in names]
        cases += [{"page_size": size, "attention_backend": one, "decode_attention_backend": two}
                  for one in names[:3] for two in names[2:6]]
    result = subprocess.run([str(real_python), str(UPSTREAM), "page-size"], cwd="/tmp",
                            input=json.dumps(cases), capture_output=True, text=True,
                            timeout=300, check=True)
    theirs = json.loads(result.stdout)
    ours = [resolved_page_size(None if case["page_size"] is None else str(case["page_size"]),
                               {dest: value for dest, value in case.items()
                                if dest != "page_size"}) for case in cases]
    differ = [(case, mine, str(real)) for case, mine, real in zip(cases, ours, theirs,
                                                                 strict=True)
              if mine != str(real)]
    assert not differ, f"{len(differ)} of {len(cases)} resolve otherwise: {differ[:5]}"
