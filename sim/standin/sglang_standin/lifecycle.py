"""One rank from start to exit: bind, join the group, load, register, serve; signals and main."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import List, Optional, Type

from . import __version__
from .args import parse_args
from .auth import redacted
from .bootstrap import BootstrapHandler, register_with_bootstrap
from .group import GroupLeader, GroupMember
from .http_api import DUMMY_HEALTH_PATHS, ApiHandler, DummyHealthHandler
from .http_base import Handler, serve, url_host
from .log import die, log, set_prefix
from .state import Standin

READY_BANNER = "The server is fired up and ready to roll!"


def load_model(st: Standin) -> None:
    a = st.args
    log(
        f"loading model {a.model_path} (tp_size={a.tp_size}, ep_size={a.ep_size}, "
        f"nnodes={a.nnodes}, node_rank={a.node_rank}, "
        f"load {st.load_seconds:.1f}s simulated) ..."
    )
    if st.exit_while_loading:
        st.shutdown.wait(st.load_seconds / 2)
        msg = (
            "Traceback (most recent call last):\n"
            '  File "sglang/srt/model_executor/model_runner.py", line 1, in load_model\n'
            f"RuntimeError: CUDA out of memory (stand-in fault injection: "
            f"SGLANG_STANDIN_EXIT_WHILE_LOADING={os.environ.get('SGLANG_STANDIN_EXIT_WHILE_LOADING')}, "
            f"node rank {st.rank})"
        )
        die(msg, 1)
    st.shutdown.wait(st.load_seconds)
    log(f"Load weight end. node rank {st.rank}: model {a.model_path} loaded (stand-in)")
    st.loaded.set()


def _serve_or_die(st: Standin, host: str, port: int, handler: Type[Handler]) -> None:
    try:
        serve(st, host, port, handler)
    except OSError as e:
        die(f"ERROR: cannot bind the {handler.kind} HTTP server to {host}:{port}: {e}")


def _install_signal_handlers(st: Standin) -> None:
    def _handler(signum, _frame):
        name = signal.Signals(signum).name
        st.shutdown.set()
        log(f"Received {name}, shutting down node rank {st.rank} (stand-in)")
        os._exit(0)

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)


def _start_bootstrap_server(st: Standin) -> None:
    a = st.args
    if st.bootstrap_delay_seconds > 0:
        # Stands for whatever holds up the tokenizer manager; the group joins and loads meanwhile.
        log(f"bootstrap server delayed {st.bootstrap_delay_seconds:.1f}s "
            "(SGLANG_STANDIN_BOOTSTRAP_DELAY_SECONDS)")
        if st.shutdown.wait(st.bootstrap_delay_seconds):
            return
    log(f"Starting bootstrap server on {a.host}:{a.disaggregation_bootstrap_port}")
    _serve_or_die(st, a.host, a.disaggregation_bootstrap_port, BootstrapHandler)
    with st.lock:
        st.registrations["Prefill:0"] = {
            "role": "Prefill", "node_rank": 0, "engine_rank": 0, "rank_ip": a.host,
            "registered_at": time.time(),
        }


def _run_rank0(st: Standin) -> None:
    a = st.args
    if st.api_keys.api_key and int(getattr(a, "tokenizer_worker_num", 1) or 1) > 1:
        # SGLang 0.5.19's tokenizer workers assert this when they start (http_server.py).
        die("AssertionError: API key is not supported in multi-tokenizer mode", 1)
    log(f"Starting HTTP server on {a.host}:{a.port} (health is 503 until ready)")
    _serve_or_die(st, a.host, a.port, ApiHandler)
    if st.mode == "prefill" and st.bootstrap_delay_seconds > 0:
        threading.Thread(target=_start_bootstrap_server, args=(st,), name="bootstrap-delay",
                         daemon=True).start()
    elif st.mode == "prefill":
        # As SGLang 0.5.19 does: with the tokenizer manager, before the model has loaded.
        _start_bootstrap_server(st)
    if st.nnodes > 1:
        GroupLeader(st).listen()
        last = 0.0
        while not st.all_peers_joined() and not st.broken:
            if time.monotonic() - last >= 10:
                log(f"dist-init: {st.not_ready_reason()}")
                last = time.monotonic()
            st.shutdown.wait(0.1)
    if not st.broken:
        load_model(st)
    last = 0.0
    while not st.broken and not st.all_prefill_registered():
        if time.monotonic() - last >= 10:
            log(st.not_ready_reason() or "")
            last = time.monotonic()
        st.shutdown.wait(0.1)
    if st.broken:
        log(f"NOT ready: {st.broken} (health stays 503)", err=True)
    else:
        log(f"{READY_BANNER} (stand-in: node rank 0 of {st.nnodes}, "
            f"{st.mode} mode, http://{url_host(a.host)}:{a.port})")
        st.announced.set()


def _run_other_rank(st: Standin) -> None:
    a = st.args
    member = GroupMember(st)
    member.connect()
    load_model(st)
    if st.mode == "prefill":
        register_with_bootstrap(st, member.local_ip())
    # SGLang 0.5.19 (engine.py) starts this once the rank's schedulers report ready.
    try:
        serve(st, a.host, a.port, DummyHealthHandler)
    except OSError as e:
        # SGLang runs it on a daemon thread: uvicorn's bind error ends that thread only, and the
        # rank goes on serving its group without a health server.
        log(f"ERROR: [Errno {e.errno}] error while attempting to bind on address "
            f"{(a.host, a.port)!r}: {(e.strerror or str(e)).lower()} (dummy health check server; "
            f"node rank {st.rank} keeps running without it)", err=True)
    else:
        log(f"Dummy health check server started at {url_host(a.host)}:{a.port} "
            f"(GET {', '.join(DUMMY_HEALTH_PATHS)} answer 200)")
    log(f"node rank {st.rank} ready (node rank 0 serves the API)")


def run(args) -> int:
    set_prefix(f"standin {args.disaggregation_mode} node_rank={args.node_rank}/{args.nnodes}")
    st = Standin(args)
    _install_signal_handlers(st)
    log(f"sglang stand-in {__version__} (python {sys.version.split()[0]}); server_args="
        + json.dumps(redacted(vars(args)), default=str))
    log(f"API keys: {st.api_keys.describe()}")
    if st.kv_fail_reason:
        log(f"WARNING: KV transfer will fail: {st.kv_fail_reason}", err=True)
    if st.rank == 0 and (st.prefill_tokens_per_s or st.decode_tokens_per_s):
        log(f"simulated speed: prefill {st.prefill_tokens_per_s or 'instant'} tokens/s, "
            f"decode {st.decode_tokens_per_s or 'instant'} tokens/s")
    if st.rank == 0:
        _run_rank0(st)
    else:
        _run_other_rank(st)
    while not st.shutdown.wait(1.0):
        pass
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    sys.exit(run(args))
