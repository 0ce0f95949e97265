"""Command-line flags of the stand-in: SGLang's own parser when it is installed, else a subset.

With the real SGLang 0.5.19 installed for the stand-in (`upstream.parse_with_real_sglang`), a
command line is parsed by SGLang's own parser: what it refuses (an unknown or ambiguous flag, a
bad choice) exits 2 with its message, and what it accepts is what the stand-in runs with.

Without it, the fallback below is a strict subset of the `launch_server` flags. Every rank gets
the same flags except `--node-rank`, as with the real server. Any flag not listed here is
rejected with argparse's `error: unrecognized arguments: ...` and exit status 2 (the same thing
SGLang prints for a flag it does not know). Abbreviations are NOT accepted (stricter than SGLang)
so that a typo in a rendered command line fails here instead of on a GPU node.

`--config FILE.yaml` works with both, merged as SGLang's `prepare_server_args` merges it: the
file's options first, then the command line, so the command line wins.

Either way the stand-in's own checks follow (ranks, --dist-init-addr, tp divisible by nnodes),
which SGLang makes later, on the GPUs. No message of the stand-in's carries the value of
--api-key or --admin-api-key (auth.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .auth import safe_error, scrub, secret_values
from .log import log

try:
    from .upstream import parse_with_real_sglang
except ImportError:  # the bridge to the real parser is optional: the fallback parser still works
    def parse_with_real_sglang(argv: List[str]) -> Any:
        return None

DISAGGREGATION_MODES = ["null", "prefill", "decode"]
TRANSFER_BACKENDS = ["mooncake", "nixl", "ascend", "fake"]


class _FallbackParser(argparse.ArgumentParser):
    """Refuses as argparse does, with the values of secret flags blanked out of the message."""

    secrets: List[str] = []

    def error(self, message: str):  # type: ignore[override]
        super().error(scrub(message, self.secrets))


def build_parser() -> _FallbackParser:
    p = _FallbackParser(
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
    p.add_argument("--api-key", type=str, default=None)
    p.add_argument("--admin-api-key", type=str, default=None)
    p.add_argument("--config", type=str, default=None, help="a YAML file of options")
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


def merge_config(parser: argparse.ArgumentParser, argv: List[str]) -> List[str]:
    """ARGV with its `--config FILE` replaced by the file's options, put first: what SGLang
    0.5.19's ConfigArgumentMerger (sglang/srt/utils/server_args_config_parser.py) makes of it.

    Each YAML key is written as `--KEY` as it is spelled (so `api_key:` gives `--api_key`, which
    the parser then refuses as SGLang's does); true/false is the flag or nothing for a
    store_true option, a list its items, a mapping JSON. Raises ValueError as SGLang does.
    """
    if "--config" not in argv:
        return argv
    at = [i for i, arg in enumerate(argv) if arg == "--config"]
    if len(at) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    i = at[0]
    if i == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[i + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {argv[i + 1]}")
    import yaml  # only for --config: a start without one does not pay for the import

    with open(path) as f:
        config = yaml.safe_load(f)
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    # argparse has no public view of its actions.
    actions = [a for a in parser._actions if a.option_strings]  # noqa: SLF001
    store_true_type, store_type = argparse._StoreTrueAction, argparse._StoreAction  # noqa: SLF001
    store_true = {a.dest for a in actions if isinstance(a, store_true_type)}
    unsupported = {a.dest: a for a in actions
                   if not isinstance(a, (store_true_type, store_type))
                   and not {"--config", "--help", "-h"} & set(a.option_strings)}
    merged: List[str] = []
    for key, value in config.items():
        dest = key.replace("-", "_")
        if dest in unsupported:
            raise ValueError(f"Unsupported config option '{dest}' with action "
                             f"'{type(unsupported[dest]).__name__}'")
        if isinstance(value, bool):
            if dest not in store_true:
                merged += [f"--{key}", str(value).lower()]
            elif value:
                merged.append(f"--{key}")
        elif isinstance(value, list):
            if value:
                merged += [f"--{key}"] + [str(item) for item in value]
        elif isinstance(value, dict):
            merged += [f"--{key}", json.dumps(value)]
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:i] + argv[i + 2:]


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
        # What SGLang itself prints before it exits: 2 for a flag it refuses, 1 for a config file
        # it cannot merge.
        sys.stderr.write(real.error.rstrip("\n") + "\n")
        sys.stderr.flush()
        sys.exit(real.exit_code)
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
        try:
            argv = merge_config(parser, argv)
        except Exception as e:  # SGLang ends with this exception's traceback: exit 1
            sys.stderr.write(safe_error(e, argv) + "\n")
            sys.stderr.flush()
            sys.exit(1)
        parser.secrets = secret_values(argv)
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
