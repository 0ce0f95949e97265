"""What one rank's threads share: knobs from the environment, the group, readiness."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from . import __version__
from .auth import ApiKeys, redacted
from .bootstrap import KVStore
from .contract import contract_of
from .log import log
from .metrics import api_registry, dummy_health_registry


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        log(f"WARNING: ignoring {name}={raw!r}: not a number", err=True)
        return default


# SGLang 0.5.19's default buckets of sglang:time_to_first_token_seconds
# (TokenizerMetricsCollector in sglang/srt/observability/metrics_collector.py).
TTFT_BUCKETS: Tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)


# Written inside a container by a test (docker exec) before it restarts the container: seconds
# the next start loads for, as a node that rebooted reloads its weights (Standin.load_seconds).
LOAD_SECONDS_FILE = "/tmp/sglang-standin-load-seconds"


def _load_seconds() -> float:
    try:
        with open(LOAD_SECONDS_FILE, encoding="utf-8") as stream:
            return max(0.0, float(stream.read().strip()))
    except (OSError, ValueError):
        return max(0.0, _env_float("SGLANG_STANDIN_LOAD_SECONDS", 2.0))


def _env_ranks(name: str) -> List[int]:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return []
    out = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            log(f"WARNING: ignoring {name} entry {part!r}: not an integer rank", err=True)
    return out


class Standin:
    def __init__(self, args):
        self.args = args
        self.rank: int = args.node_rank
        self.nnodes: int = args.nnodes
        self.mode: str = args.disaggregation_mode
        self.load_seconds = _load_seconds()
        self.exit_while_loading = self.rank in _env_ranks("SGLANG_STANDIN_EXIT_WHILE_LOADING")
        self.kv_wait_seconds = max(0.0, _env_float("SGLANG_STANDIN_KV_WAIT_SECONDS", 5.0))
        self.dist_timeout = max(0.0, _env_float("SGLANG_STANDIN_DIST_TIMEOUT", 600.0))
        self.bootstrap_timeout = max(0.0, _env_float("SGLANG_STANDIN_BOOTSTRAP_TIMEOUT", 60.0))
        # Seconds rank 0 lives on after losing a peer (SGLang: the watchdog on the hung
        # collective kills the server); 0 or less keeps it alive and unhealthy.
        self.watchdog_seconds = _env_float("SGLANG_STANDIN_WATCHDOG_SECONDS", 10.0)
        # A hung group (group.py's steps): a peer that has not answered a step for this long
        # stalls the whole group's forward, as a rank stuck in a collective does.
        self.step_timeout = max(0.2, _env_float("SGLANG_STANDIN_STEP_TIMEOUT_SECONDS", 5.0))
        # SGLang 0.5.19's /health waits this long for any output of the scheduler, then answers
        # 503 (srt/entrypoints/http_server.py: HEALTH_CHECK_TIMEOUT, health_generate).
        self.health_check_timeout = max(0.0, _env_float("SGLANG_HEALTH_CHECK_TIMEOUT", 20.0))
        # A busy group's /health: SGLang's waits for the scheduler's next output, which long
        # chunked prefills hold back, so it answers late (and 200) while requests run. Seconds
        # of that delay: this env, or the number in BUSY_HEALTH_FILE (read at each /health, so a
        # test can make a running group busy), only while rank 0 has requests running.
        self.busy_health_seconds = max(0.0, _env_float("SGLANG_STANDIN_BUSY_HEALTH_SECONDS", 0.0))
        # A forward with work that makes no progress this long kills the server (srt/utils/
        # watchdog.py: WatchdogRaw, SIGQUIT to the parent process; --watchdog-timeout, 300 s).
        self.watchdog_timeout = float(getattr(args, "watchdog_timeout", None) or 300.0)
        # Seconds prefill rank 0 waits before it opens its bootstrap port (0: at start, as
        # SGLang does); the group joins and loads meanwhile. Lets a test hold decode back.
        self.bootstrap_delay_seconds = max(
            0.0, _env_float("SGLANG_STANDIN_BOOTSTRAP_DELAY_SECONDS", 0.0))
        # Simulated compute speed; 0 (the default) answers at once. Prefill: prompt tokens per
        # second, which delays the room's KV (so decode's first token). Decode: output tokens per
        # second after the first one.
        self.prefill_tokens_per_s = max(0.0, _env_float("SGLANG_STANDIN_PREFILL_TOKENS_PER_S", 0.0))
        self.decode_tokens_per_s = max(0.0, _env_float("SGLANG_STANDIN_DECODE_TOKENS_PER_S", 0.0))
        self.kv_fail_reason: Optional[str] = None
        if os.environ.get("SGLANG_STANDIN_KV_FAIL", "").strip() not in ("", "0", "false"):
            self.kv_fail_reason = "SGLANG_STANDIN_KV_FAIL is set (stand-in fault injection)"
        elif (
            "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()
            and args.disaggregation_transfer_backend == "mooncake"
            and self.mode != "null"
        ):
            # Mooncake issues #351/#2511: registration fails, the server still looks healthy, and
            # every KV transfer fails.
            self.kv_fail_reason = (
                "Failed to register memory: Bad address "
                "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with Mooncake)"
            )

        # Checked on rank 0's API server only (the bootstrap and dummy health servers have none).
        self.api_keys = ApiKeys(
            getattr(args, "api_key", None), getattr(args, "admin_api_key", None),
            tokenizer_workers=int(getattr(args, "tokenizer_worker_num", 1) or 1),
            dumper_route=os.environ.get("DUMPER_SERVER_PORT") == "reuse")

        self.lock = threading.Lock()
        self.loaded = threading.Event()
        # Set once the ready banner is printed: /health turns 200 only after it, as in SGLang,
        # so a log read after a 200 always shows the banner.
        self.announced = threading.Event()
        self.start_time = time.time()
        self.broken: Optional[str] = None
        # Set while the forward runs; cleared while the group is stalled (stalled_since, why).
        self.flowing = threading.Event()
        self.flowing.set()
        self.stalled_since: Optional[float] = None
        self.stall_reason: Optional[str] = None
        # Health checks waiting on a stalled forward: work the watchdog counts as active.
        self.health_waiting = 0
        self.peers: Dict[int, socket.socket] = {}
        self.joined_once: set = set()
        self.registrations: Dict[str, Dict[str, Any]] = {}
        self.kv = KVStore()
        # The KV contract of this server's flags, which prefill's KV carries and decode checks
        # (contract.py: a test oracle of the sim); KV of another contract decode received.
        self.kv_contract = contract_of(args)
        self.kv_contract_mismatches = 0
        self.num_requests = 0
        # What /metrics reports with SGLang's names, all under self.lock: sequences being served
        # now, and per is_streaming ("true"/"false") what finished sequences added up to and the
        # time-to-first-token histogram (bucket counts, not cumulative; sum; count).
        self.num_running_reqs = 0
        self.served: Dict[str, Dict[str, int]] = {}
        self.ttft_buckets: Tuple[float, ...] = tuple(
            sorted(float(b) for b in (getattr(args, "bucket_time_to_first_token", None)
                                      or TTFT_BUCKETS)))
        self.ttft: Dict[str, List[Any]] = {}
        # One registry per HTTP server (metrics.py): rank 0's API, ranks >= 1's dummy health.
        self.api_metrics = api_registry(self)
        self.dummy_health_metrics = dummy_health_registry(self)
        self.shutdown = threading.Event()

    # ---------------- readiness (rank 0)

    def wait_flowing(self) -> None:
        """Block while the group's forward is stalled: a request makes no progress on a hung
        group. Returns once it flows again, or the server stops or breaks."""
        while not self.flowing.wait(0.5):
            if self.shutdown.is_set() or self.broken:
                return

    def all_peers_joined(self) -> bool:
        with self.lock:
            return len(self.peers) == self.nnodes - 1

    def all_prefill_registered(self) -> bool:
        if self.mode != "prefill":
            return True
        with self.lock:
            ranks = {r.get("node_rank") for r in self.registrations.values()}
        return all(r in ranks for r in range(self.nnodes))

    def not_ready_reason(self) -> Optional[str]:
        if self.broken:
            return f"group broken: {self.broken}"
        if not self.all_peers_joined():
            with self.lock:
                missing = sorted(set(range(1, self.nnodes)) - set(self.peers))
            return f"waiting for node ranks {missing} to join the group"
        if not self.loaded.is_set():
            return "loading model"
        if not self.all_prefill_registered():
            return "waiting for prefill ranks to register with the bootstrap server"
        if not self.announced.is_set():
            return "warming up"
        return None

    # ---------------- what the info endpoints report

    def server_info(self) -> Dict[str, Any]:
        # SGLang 0.5.19 reports the keys themselves here; the stand-in only that they are set.
        info = redacted(vars(self.args))
        info.update(
            {
                "version": "standin",
                "standin_version": __version__,
                "status": "ready" if self.not_ready_reason() is None else "not_ready",
                "not_ready_reason": self.not_ready_reason(),
                "group_broken": self.broken,
                "connected_node_ranks": [0] + sorted(self.peers),
                "bootstrap_registrations": len(self.registrations),
                "num_requests": self.num_requests,
                "internal_states": [
                    {"last_gen_throughput": 0.0, "avg_spec_accept_length": None}
                ],
            }
        )
        return info

    def model_info(self) -> Dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "served_model_name": self.args.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "standin",
            "architectures": ["StandinForCausalLM"],
        }

    def models_list(self) -> Dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.args.served_model_name,
                    "object": "model",
                    "created": int(self.start_time),
                    "owned_by": "sglang",
                    "root": self.args.model_path,
                    "max_model_len": self.args.context_length or 131072,
                }
            ],
        }

    # ---------------- /metrics: SGLang 0.5.19's names (sglang/srt/observability/metrics_collector.py)

    def seq_started(self) -> None:
        with self.lock:
            self.num_running_reqs += 1

    def seq_first_token(self, seconds: float, streaming: bool) -> None:
        key = "true" if streaming else "false"
        seconds = max(0.0, seconds)
        with self.lock:
            h = self.ttft.setdefault(key, [[0] * (len(self.ttft_buckets) + 1), 0.0, 0])
            i = next((i for i, b in enumerate(self.ttft_buckets) if seconds <= b),
                     len(self.ttft_buckets))
            h[0][i] += 1
            h[1] += seconds
            h[2] += 1

    def seq_ended(self, streaming: bool, prompt_tokens: Optional[int] = None,
                  generation_tokens: Optional[int] = None) -> None:
        """A sequence stops running; with token counts it finished and they are counted."""
        with self.lock:
            self.num_running_reqs -= 1
            if prompt_tokens is None:
                return
            c = self.served.setdefault("true" if streaming else "false",
                                       {"prompt": 0, "generation": 0, "requests": 0})
            c["prompt"] += prompt_tokens
            c["generation"] += generation_tokens or 0
            c["requests"] += 1

    def common_labels(self) -> Dict[str, Any]:
        engine_type = {"prefill": "prefill", "decode": "decode"}.get(self.mode, "unified")
        labels: Dict[str, Any] = {"model_name": self.args.served_model_name,
                                  "engine_type": engine_type}
        if getattr(self.args, "enable_priority_scheduling", False):
            labels["priority"] = ""
        return labels

    def extra_labels(self) -> Dict[str, Any]:
        extra = getattr(self.args, "extra_metric_labels", None)
        return dict(extra) if isinstance(extra, dict) else {}

    def scheduler_labels(self) -> Dict[str, Any]:
        """The labels of SchedulerMetricsCollector, for this node's first scheduler (on rank 0:
        tp_rank 0). dp_rank only with --dp-size > 1, where SGLang passes one."""
        a = self.args
        tp = max(1, int(getattr(a, "tp_size", 1) or 1))
        ep = max(1, int(getattr(a, "ep_size", 1) or 1))
        dp = max(1, int(getattr(a, "dp_size", 1) or 1))
        tp_rank = self.rank * (tp // max(1, self.nnodes))
        labels = self.common_labels()
        labels.update(tp_rank=tp_rank, pp_rank=0, moe_ep_rank=tp_rank // max(1, tp // ep))
        if dp > 1:
            labels["dp_rank"] = tp_rank // max(1, tp // dp)
        labels.update(self.extra_labels())
        return labels
