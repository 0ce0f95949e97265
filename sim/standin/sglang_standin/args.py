"""Command-line flags of the stand-in: SGLang's own parser when it is installed, else a subset.

With the real SGLang 0.5.19 installed for the stand-in (`upstream.parse_with_real_sglang`), a
command line is parsed by SGLang's own parser: what it refuses (an unknown or ambiguous flag, a
bad choice) exits 2 with its message, and what it accepts is what the stand-in runs with.

Without it, the fallback below is a strict subset of the `launch_server` flags. Every rank gets
the same flags except `--node-rank`, as with the real server. Any flag not listed here is
rejected with argparse's `error: unrecognized arguments: ...` and exit status 2 (the same thing
SGLang prints for a flag it does not know). Abbreviations are NOT accepted (stricter than SGLang)
so that a typo in a rendered command line fails here instead of on a GPU node.

Either way the stand-in's own checks follow (ranks, --dist-init-addr, tp divisible by nnodes),
which SGLang makes later, on the GPUs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional, Tuple

from .log import log

try:
    from .upstream import parse_with_real_sglang
except ImportError:  # the bridge to the real parser is optional: the fallback parser still works
    def parse_with_real_sglang(argv: List[str]) -> Any:
        return None

DISAGGREGATION_MODES = ["null", "prefill", "decode"]
TRANSFER_BACKENDS = ["mooncake", "nixl", "ascend", "fake"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m sglang.launch_server",
        description="SGLang stand-in server (no GPU; speaks the SGLang HTTP API)",
        allow_abbrev=False,
    )
    # Model and tokenizer
    p.add_argument("--model-path", type=str, required=True)
    p.add_argument("--served-model-name", type=str, default=None)
    p.add_argument("--tokenizer-path", type=str, default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--load-format", type=str, default="auto")
    p.add_argument("--context-length", type=int, default=None)
    # HTTP server
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--log-level", type=str, default="info")
    p.add_argument("--watchdog-timeout", type=float, default=300.0)
    # Parallelism and multi-node
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--ep-size", "--ep", dest="ep_size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", type=str, default=None, help="HOST:PORT of rank 0")
    # PD disaggregation
    p.add_argument("--disaggregation-mode", type=str, default="null", choices=DISAGGREGATION_MODES)
    p.add_argument(
        "--disaggregation-transfer-backend", type=str, default="mooncake", choices=TRANSFER_BACKENDS
    )
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-ib-device", type=str, default=None)
    # Memory and scheduling
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--attention-backend", type=str, default=None)
    p.add_argument("--moe-a2a-backend", type=str, default="none")
    p.add_argument("--kv-cache-dtype", type=str, default="auto")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--cuda-graph-bs", type=int, nargs="+", default=None)
    return p


def split_host_port(addr: str) -> Tuple[str, int]:
    """Split HOST:PORT (IPv6 as [::1]:PORT).  Raises ValueError."""
    if ":" not in addr:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    host, port_s = addr.rsplit(":", 1)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    port = int(port_s)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {addr!r}")
    return host, port


def _defaults(parser: argparse.ArgumentParser) -> Dict[str, Any]:
    # argparse has no public view of its actions.
    return {a.dest: a.default for a in parser._actions if a.dest != "help"}  # noqa: SLF001


def _option_count(parser: argparse.ArgumentParser) -> int:
    return sum(len(a.option_strings) for a in parser._actions if a.dest != "help")  # noqa: SLF001


def _parse_real(parser: argparse.ArgumentParser, argv: List[str]) -> Optional[argparse.Namespace]:
    """The flags as SGLang's own parser reads them; None where it is not installed."""
    real = parse_with_real_sglang(argv)
    if real is None:
        log(
            "stand-in: real SGLang parser not installed; using the fallback parser "
            f"({_option_count(parser)} flags, no abbreviations)"
        )
        return None
    if not real.ok:
        # What SGLang itself prints before it exits 2 on a flag it refuses.
        sys.stderr.write(real.error.rstrip("\n") + "\n")
        sys.stderr.flush()
        sys.exit(2)
    log(f"stand-in: flags parsed by the real SGLang {real.version} parser")
    # Every attribute the stand-in reads exists even where SGLang names or defaults it otherwise.
    args = argparse.Namespace(**_defaults(parser))
    vars(args).update(real.values)
    return args


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        # The real parser answers with a verdict, not a help text: help comes from the fallback.
        parser.parse_args(argv)  # prints it and exits 0
    args = _parse_real(parser, argv)
    if args is None:
        args = parser.parse_args(argv)  # unknown flag -> "error: unrecognized arguments", exit 2
        fail = parser.error
    else:
        def fail(message: str) -> None:
            # Not the fallback's usage: those are not the flags that were parsed.
            parser.exit(2, f"{parser.prog}: error: {message}\n")

    if args.nnodes < 1:
        fail(f"--nnodes must be >= 1, got {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        fail(
            f"--node-rank must satisfy 0 <= node_rank < nnodes, got node_rank={args.node_rank} "
            f"nnodes={args.nnodes}"
        )
    if args.nnodes > 1 and not args.dist_init_addr:
        fail("--dist-init-addr HOST:PORT is required when --nnodes > 1")
    if args.dist_init_addr:
        try:
            args.dist_init_host, args.dist_init_port = split_host_port(args.dist_init_addr)
        except ValueError as e:
            fail(f"invalid --dist-init-addr: {e}")
    else:
        args.dist_init_host, args.dist_init_port = None, None
    for name in ("tp_size", "ep_size", "dp_size"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1")
    if args.tp_size % args.nnodes != 0:
        fail(
            f"--tp-size ({args.tp_size}) must be divisible by --nnodes ({args.nnodes})"
        )
    for name in ("port", "disaggregation_bootstrap_port"):
        v = getattr(args, name)
        if not 0 < v < 65536:
            fail(f"--{name.replace('_', '-')} out of range: {v}")
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    return args
