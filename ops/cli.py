"""The command line: `scripts/kimipd [-s STACK] {status,logs,verify,targets,orphans,reconcile}
...`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn



from . import DEGRADED, DOWN, OK, USAGE, reconcile_cli
from .arguments import common as _common
from .arguments import positive as _positive
from .engine_cli import run_engine
from .logs_cli import run_logs
from .orphans_cli import run_orphans
from .probe import VIA_CHOICES
from .rollout_cli import run_rollout
from .remote import RemoteError, SshTransport, Transport
from .stack import Access, StackError, load_stack
from .status_cli import run_status
from .targets_cli import run_targets
from .verify_cli import run_verify

EXIT_CODES = (f"exit codes: {OK} all serve / all pass, {DEGRADED} degraded / regression / "
              f"something not collected, {DOWN} stack down (serving false, no outputs) or "
              f"unreachable, {USAGE} a wrong command line")
VIA_HELP = ("how HTTP is probed: direct from this machine, ssh (curl on the node), or auto "
            "(direct, then ssh when the port cannot be reached from here); default auto")


class _Parser(argparse.ArgumentParser):
    """argparse's, but a wrong command line exits USAGE, not argparse's 2, which is DOWN here.
    Its subcommands' parsers are of this class too (add_subparsers takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kimipd",
        description="Day-two operations on a deployed kimipd stack. The topology comes from "
                    "the stack's outputs (pulumi stack output), the way to the nodes from its "
                    "config (kimipd:connection, kimipd:nodes, the sshPrivateKey secret or "
                    "ssh-agent).",
        epilog=EXIT_CODES)
    _common(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = commands.add_parser(
        "status", help="every container's state, health and the whole path, in one table",
        description="One row per container (mc-master, every rank of every group, router): "
                    "node, docker state and uptime (docker inspect over SSH), the "
                    "kimipd.restart-generation label, its healthUrl; then one 1-token /generate "
                    "through the router. With the door: its port, each slot's readiness and "
                    "state at the door (HAProxy's runtime API over SSH) and each group's place "
                    "in each slot (registered, healthy, load). Probes run in parallel, each "
                    "with its own timeout.",
        epilog=EXIT_CODES)
    _common(status, suppress=True)
    status.add_argument("--json", action="store_true", help="print JSON instead of the table "
                        "(one document per refresh with --watch)")
    status.add_argument("--watch", action="store_true", help="refresh until interrupted")
    status.add_argument("--interval", type=_positive, default=5.0, metavar="SECONDS",
                        help="seconds between refreshes with --watch (default 5)")
    status.add_argument("--timeout", type=_positive, default=5.0, metavar="SECONDS",
                        help="per probe: SSH connect, docker inspect, one health check "
                             "(default 5)")
    status.add_argument("--generate-timeout", type=_positive, default=60.0, metavar="SECONDS",
                        help="the 1-token /generate through the router (default 60)")
    status.add_argument("--via", choices=VIA_CHOICES, default="auto", help=VIA_HELP)
    status.set_defaults(func=run_status)

    logs = commands.add_parser(
        "logs", help="collect logs, docker inspect and node diagnostics into one .tar.gz",
        description="In parallel over SSH: every kimipd-* container's `docker logs "
                    "--timestamps --since X` and `docker inspect`, and each node's nvidia-smi, "
                    "ibstat, `rdma link` (absent tools are noted, not errors) and `docker ps -a`, "
                    "into kimipd-logs-STACK-TIME.tar.gz with index.json and INDEX.txt.",
        epilog=EXIT_CODES)
    _common(logs, suppress=True)
    logs.add_argument("--role", action="append", default=[], metavar="ROLE",
                      help="only these containers (and their nodes): a role (decode-r1; "
                           "door: the door's access log; router-a), a role prefix (decode, "
                           "mooncake, router: the router or both of the door's slots), a group "
                           "name or mode; repeatable")
    logs.add_argument("--since", default="1h",
                      help="docker logs --since: a duration (30m, 2h) or a time (default 1h)")
    logs.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                      help="where to write the bundle (default: the current directory)")
    logs.add_argument("--timeout", type=_positive, default=60.0, metavar="SECONDS",
                      help="per command on a node (default 60)")
    logs.add_argument("--json", action="store_true", help="print the bundle's index.json")
    logs.set_defaults(func=run_logs)

    verify = commands.add_parser(
        "verify", help="the runbook's requests through the router, timed; baseline check",
        description="Sends the kimipd:verification baseline's requests (default: the runbook's "
                    "warmup 6->16, medium 1680->512, long 5280->256 tokens) to generateUrl as "
                    "SGLang /generate with input_ids, ignore_eos and stream, one at a time; "
                    "reports status, output tokens, time to first token, end-to-end seconds, "
                    "prefill tokens/s (input / TTFT) and decode tokens/s ((output - 1) / "
                    "(e2e - TTFT)). A figure beyond the baseline's tolerance is a regression.",
        epilog=EXIT_CODES)
    _common(verify, suppress=True)
    verify.add_argument("--json", action="store_true", help="print JSON instead of the table")
    verify.add_argument("--timeout", type=_positive, default=600.0, metavar="SECONDS",
                        help="per request (default 600)")
    verify.add_argument("--via", choices=VIA_CHOICES, default="auto", help=VIA_HELP)
    verify.add_argument("--seed", type=int, help="seed of the prompts' token ids (default: the "
                        "time; a repeated prompt would hit the prefix cache)")
    verify.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="only this baseline request (warmup, medium, long); repeatable")
    verify.set_defaults(func=run_verify)

    targets = commands.add_parser(
        "targets", help="write the prometheusTargets output as a Prometheus file_sd file",
        description="Writes the stack's prometheusTargets output (every SGLang rank's /metrics "
                    "and the Mooncake master's metrics port, labelled stack, group, mode, rank, "
                    "node, role) to FILE for a file_sd_configs entry; Prometheus re-reads it "
                    "when it changes. Written atomically (a temporary file, then rename).",
        epilog=f"exit codes: {OK} written, {DEGRADED} the stack lists no targets "
               f"(metrics.enabled is false), {DOWN} the stack cannot be read")
    _common(targets, suppress=True)
    targets.add_argument("--out", type=Path, required=True, metavar="FILE",
                         help="the file_sd file to write, e.g. /etc/prometheus/kimipd.json")

    orphans = commands.add_parser(
        "orphans", help="kimipd containers the stack's state does not know (after a killed up)",
        description="Lists, over SSH on every node of the stack, the containers labelled "
                    "kimipd.role whose id `pulumi stack export` does not record (a pulumi "
                    "process killed mid-up leaves them; the next up fails with 'name already "
                    "in use'), and every container of their SGLang groups (a rank left alone "
                    "would wait for a group that no longer exists). --remove removes them "
                    "(docker rm -f); then `pulumi refresh --clear-pending-creates` and "
                    "`pulumi up` start those groups whole.",
        epilog=f"exit codes: {OK} none found (or all removed), {DEGRADED} found and not removed, "
               f"a node not reached or a removal failed, {DOWN} the stack cannot be read")
    _common(orphans, suppress=True)
    orphans.add_argument("--remove", action="store_true",
                         help="remove them (docker rm -f), each on its node")
    orphans.add_argument("--json", action="store_true", help="print JSON instead of the table")
    orphans.add_argument("--timeout", type=_positive, default=30.0, metavar="SECONDS",
                         help="per command on a node (default 30)")
    orphans.set_defaults(func=run_orphans)

    rollout = commands.add_parser(
        "rollout", help="the rollout's record on router.node; `stop`: end a running update",
        description="Prints the record a change of contract keeps on router.node (its phase: "
                    "steady, replacing, converting, split; each slot's contract; the leases). "
                    "`kimipd rollout stop` asks every node script of an update running now to "
                    "stop waiting: the update ends within seconds and the next `kimipd up` goes "
                    "on from there, or back with the old config (docs/router.md).",
        epilog=f"exit codes: {OK} steady (or stopped), {DEGRADED} a change of contract under "
               f"way, {DOWN} the record cannot be read")
    _common(rollout, suppress=True)
    rollout.add_argument("action", nargs="?", choices=["show", "stop"], default="show")
    rollout.add_argument("--json", action="store_true", help="print the record as JSON")
    rollout.add_argument("--timeout", type=_positive, default=30.0, metavar="SECONDS",
                         help="for the command on router.node (default 30)")
    rollout.set_defaults(func=run_rollout)

    reconcile_cli.add_parser(commands)

    for operation in ("up", "preview"):
        engine = commands.add_parser(
            operation, help=f"`pulumi {operation}` that never contacts a node taken out",
            description=f"`pulumi {operation}` of the stack, the program run inline (as "
                        "reconcile runs it), with the resources the state holds on every node "
                        "taken out (kimipd:nodes[].out) excluded, so none of them is contacted"
                        + ("; once the update converges they are dropped from the state. It "
                           "shows the preview and asks first, unless --yes."
                           if operation == "up" else "."),
            epilog=EXIT_CODES)
        _common(engine, suppress=True)
        engine.add_argument("--diff", action="store_true", help="show each resource's diff")
        if operation == "up":
            engine.add_argument("--yes", action="store_true",
                                help="update without the preview and its question")
            engine.add_argument("-m", "--message", help="the update's message in the history")
        engine.set_defaults(func=None)
    return parser


def main(argv: list[str] | None = None,
         transport_factory: Callable[[Access], Transport] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "targets":
        return run_targets(args)
    if args.command == "reconcile":
        return reconcile_cli.run(args, transport_factory)
    if args.command in ("up", "preview"):
        return run_engine(args)
    try:
        stack = load_stack(args.stack, args.cwd, args.outputs_json, args.config_json)
    except StackError as error:
        print(f"kimipd: {error}", file=sys.stderr)
        return DOWN
    try:
        if transport_factory is not None:
            transport = transport_factory(stack.access)
        else:
            connect_timeout = getattr(args, "timeout", 10.0) if args.command == "status" else 10.0
            transport = SshTransport(stack.access, connect_timeout=connect_timeout)
    except RemoteError as error:
        print(f"kimipd: {error}", file=sys.stderr)
        return DOWN
    try:
        return args.func(args, stack, transport)
    finally:
        transport.close()
