"""What one rank's threads share: knobs from the environment, the group, readiness."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional

from . import __version__
from .bootstrap import KVStore
from .log import log


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        log(f"WARNING: ignoring {name}={raw!r}: not a number", err=True)
        return default


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
        self.load_seconds = max(0.0, _env_float("SGLANG_STANDIN_LOAD_SECONDS", 2.0))
        self.exit_while_loading = self.rank in _env_ranks("SGLANG_STANDIN_EXIT_WHILE_LOADING")
        self.kv_wait_seconds = max(0.0, _env_float("SGLANG_STANDIN_KV_WAIT_SECONDS", 5.0))
        self.dist_timeout = max(0.0, _env_float("SGLANG_STANDIN_DIST_TIMEOUT", 600.0))
        self.bootstrap_timeout = max(0.0, _env_float("SGLANG_STANDIN_BOOTSTRAP_TIMEOUT", 60.0))
        # Seconds rank 0 lives on after losing a peer (SGLang: the watchdog on the hung
        # collective kills the server); 0 or less keeps it alive and unhealthy.
        self.watchdog_seconds = _env_float("SGLANG_STANDIN_WATCHDOG_SECONDS", 10.0)
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

        self.lock = threading.Lock()
        self.loaded = threading.Event()
        # Set once the ready banner is printed: /health turns 200 only after it, as in SGLang,
        # so a log read after a 200 always shows the banner.
        self.announced = threading.Event()
        self.start_time = time.time()
        self.broken: Optional[str] = None
        self.peers: Dict[int, socket.socket] = {}
        self.joined_once: set = set()
        self.registrations: Dict[str, Dict[str, Any]] = {}
        self.kv = KVStore()
        self.num_requests = 0
        self.shutdown = threading.Event()

    # ---------------- readiness (rank 0)

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
        info = {k: v for k, v in vars(self.args).items()}
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

    def metrics_text(self) -> str:
        name = self.args.served_model_name
        lbl = f'{{model_name="{name}"}}'
        ready = 1 if self.not_ready_reason() is None else 0
        return (
            f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{lbl} 0\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{lbl} 0\n"
            f"# TYPE sglang:standin_requests_total counter\n"
            f"sglang:standin_requests_total{lbl} {self.num_requests}\n"
            f"# TYPE sglang:standin_ready gauge\nsglang:standin_ready{lbl} {ready}\n"
        )
