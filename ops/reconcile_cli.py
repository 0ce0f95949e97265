"""`scripts/kimipd reconcile`: its options and the loop around ops/reconcile.py's passes."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from . import USAGE
from . import reconcile as reconcile_command
from .arguments import common, not_negative, positive
from .heal_policy import REFUSED, SERVING, WAITING, Limits
from .policy_pack import require_pack
from .reconcile_metrics import MetricsEndpoint
from .remote import SshTransport, Transport
from .pulumi_workspace import StackReader
from .stack import Access, StackError, load_stack


def add_parser(commands) -> None:
    reconcile = commands.add_parser(
        "reconcile", help="heal dead groups: refresh and up when a container stays down",
        description="One pass (or one every --interval seconds with --watch): every "
                    "container's docker state and health, as `status`; a unit (a group, the "
                    "Mooncake master, the router; with the door, the door and each slot, "
                    "router-a and router-b) broken for longer than --grace-seconds is "
                    "healed with `pulumi refresh` and `pulumi up` on this stack (the group is "
                    "replaced whole, gated, re-admitted, smoke-tested), unless the limits say "
                    "no: at most --max-heals-per-hour per unit, back-off after a failed heal, "
                    "nothing while another update holds the stack or for "
                    "--human-window-minutes after a person's update, and never over config "
                    "changes no one applied. Every decision is a JSON line (--log).",
        epilog=f"exit codes (one pass): {SERVING} every unit serves, healed, or serving is "
               f"false; {WAITING} broken and left for now (grace, lock, a person's recent "
               f"update, dry run); {REFUSED} the heal failed or was refused (limit, back-off, "
               "pending changes, a node unreachable, the stack unreadable)")
    common(reconcile, suppress=True)
    reconcile.add_argument("--watch", action="store_true",
                           help="a pass every --interval seconds until SIGTERM/SIGINT (a heal "
                                "under way is finished first)")
    reconcile.add_argument("--interval", type=positive, default=30.0, metavar="SECONDS",
                           help="seconds between passes with --watch (default 30)")
    reconcile.add_argument("--dry-run", action="store_true",
                           help="decide and log, run no refresh or up, write no state")
    reconcile.add_argument("--grace-seconds", type=not_negative, default=60.0,
                           metavar="SECONDS", help="how long a unit stays broken before it is "
                                                   "healed (default 60)")
    reconcile.add_argument("--max-heals-per-hour", type=int, default=3, metavar="K",
                           help="heals per unit in any hour; then it stops trying and says so "
                                "(default 3)")
    reconcile.add_argument("--backoff-seconds", type=not_negative, default=60.0,
                           metavar="SECONDS", help="wait after a failed heal, doubled after "
                                                   "each further failure (default 60)")
    reconcile.add_argument("--backoff-max-seconds", type=not_negative, default=1800.0,
                           metavar="SECONDS", help="the longest back-off (default 1800)")
    reconcile.add_argument("--human-window-minutes", type=not_negative, default=15.0,
                           metavar="MINUTES", help="hands off this long after an update not "
                                                   "made by reconcile (default 15)")
    reconcile.add_argument("--state-file", type=Path, metavar="FILE",
                           help="heal counts and back-off, kept across restarts (default "
                                "$XDG_STATE_HOME/kimipd/reconcile-STACK.json, "
                                "~/.local/state/...)")
    reconcile.add_argument("--log", type=Path, metavar="FILE",
                           help="append the JSON lines here (default: standard output)")
    reconcile.add_argument("--metrics-file", type=Path, metavar="FILE",
                           help="write Prometheus text here after every pass (node_exporter's "
                                "textfile collector)")
    reconcile.add_argument("--metrics-listen", metavar="HOST:PORT",
                           help="serve the same text at http://HOST:PORT/metrics")
    reconcile.add_argument("--timeout", type=positive, default=5.0, metavar="SECONDS",
                           help="per probe, as status --timeout (default 5)")


def run(args: argparse.Namespace,
        transport_factory: Callable[[Access], Transport] | None) -> int:
    """The stack is read again on every pass: a heal or a person's `up` changes its outputs."""
    if args.max_heals_per_hour < 1:
        print(f"kimipd reconcile: --max-heals-per-hour {args.max_heals_per_hour}: must be at "
              "least 1 (use --dry-run to only report)", file=sys.stderr)
        return USAGE
    try:
        name = args.stack or StackReader(None, args.cwd).name
        if not args.dry_run:
            require_pack()  # every heal runs the policy pack: refused at start, not at a heal
    except StackError as error:
        print(f"kimipd: {error}", file=sys.stderr)
        return REFUSED
    limits = Limits(grace_seconds=args.grace_seconds,
                    max_heals_per_hour=args.max_heals_per_hour,
                    backoff_seconds=args.backoff_seconds,
                    backoff_max_seconds=args.backoff_max_seconds,
                    human_window_seconds=args.human_window_minutes * 60)
    log = args.log.open("a") if args.log else sys.stdout
    settings = reconcile_command.Settings(
        stack=name, project_dir=args.cwd, limits=limits, dry_run=args.dry_run,
        state_file=args.state_file or reconcile_command.default_state_file(name), log=log,
        metrics_file=args.metrics_file, probe_timeout=args.timeout,
        echo=sys.stdout if args.log else None)
    factory = transport_factory or (
        lambda access: SshTransport(access, connect_timeout=args.timeout))
    try:
        reconciler = reconcile_command.Reconciler(
            settings, lambda: load_stack(name, args.cwd, args.outputs_json, args.config_json),
            factory)
    except StackError as error:
        print(f"kimipd reconcile: {error}", file=sys.stderr)
        return REFUSED
    if args.metrics_listen:
        host, _, port = args.metrics_listen.rpartition(":")
        reconciler.endpoint = MetricsEndpoint(
            host or "127.0.0.1", int(port), reconciler.metrics.registry)
    try:
        if not args.watch:
            return reconciler.run_pass().exit_code
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        reconciler.watch(args.interval, stop)
        return SERVING
    finally:
        if reconciler.endpoint is not None:
            reconciler.endpoint.close()
        if args.log:
            log.close()
