"""The command line: `scripts/kimipd [-s STACK] {status,logs,verify,targets,orphans,reconcile}
...`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from pulumi import automation as auto
from rich.console import Console
from rich.live import Live

from components.outputs import OutputsError, read_outputs

from . import DEGRADED, DOWN, OK, USAGE, reconcile_cli, status_render
from . import logs as logs_command
from . import orphans as orphans_command
from . import status as status_command
from . import verdict
from . import verify as verify_command
from .arguments import common as _common
from .arguments import positive as _positive
from .heal_policy import Memory
from .node_out import OutUpdate
from .probe import VIA_CHOICES, Prober
from .reconcile import default_state_file, load_memory
from .remote import RemoteError, SshTransport, Transport
from .pulumi_workspace import StackReader
from .stack import Access, Stack, StackError, load_stack
from .stack_engine import StackEngine, engine_error_hint

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


def run_engine(args: argparse.Namespace) -> int:
    """`kimipd up` / `kimipd preview` (ops/node_out.py)."""
    try:
        update = OutUpdate(StackEngine(args.stack, args.cwd))
        if args.command == "preview":
            return update.preview(args.diff)
        return update.up(args.diff, args.yes, args.message)
    except (StackError, auto.CommandError) as error:
        print(f"kimipd {args.command}: {str(error).strip()[-2000:]}", file=sys.stderr)
        hint = engine_error_hint(str(error))
        if hint is not None:
            print(f"kimipd {args.command}: {hint}", file=sys.stderr)
        return DOWN


def reconcile_memory(stack: str) -> Memory | None:
    """What reconcile remembers of STACK (its state file), if it runs on this host: when it
    first found each node lost, and its last failed heal."""
    path = default_state_file(stack)
    if not path.exists():
        return None
    try:
        return load_memory(path)
    except StackError:
        return None


def console() -> Console:
    # Not a terminal (a file, a pipe, docs): wide enough for the tables, no colour codes.
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 220)
    return Console(width=width, highlight=False)


def run_status(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    prober = Prober(transport, args.timeout, args.via, tls=status_command.door_tls(stack))
    out = console()

    def once() -> verdict.Report:
        forget = getattr(transport, "forget_failures", None)
        if forget is not None:
            forget()
        report = status_command.collect(stack.topology, transport, prober, args.timeout,
                                        args.generate_timeout, stack.router_api_key,
                                        stack.router_kind)
        memory = reconcile_memory(stack.topology.stack)
        if report.lost and memory is not None:
            verdict.note_lost_since(report, memory.lost_since)
        if report.hung and memory is not None:
            verdict.note_hung_since(report, {unit: state.broken_since
                                                    for unit, state in memory.units.items()})
        if memory is not None and memory.last_failure:
            report.notes.append(f"reconcile: the last heal failed: {memory.last_failure} "
                                "(its log line has the error lines; scripts/kimipd logs)")
        return report

    if not args.watch:
        report = once()
        prober.close()
        if args.json:
            print(json.dumps(report.as_json(), indent=2))
        else:
            out.print(status_render.render(report))
        return report.exit_code
    code = DOWN
    try:
        if args.json:
            while True:
                report = once()
                print(json.dumps(report.as_json()), flush=True)
                code = report.exit_code
                time.sleep(args.interval)
        with Live(console=out, auto_refresh=False) as live:
            while True:
                report = once()
                live.update(status_render.render(report), refresh=True)
                code = report.exit_code
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return code


@contextmanager
def progress_line(args: argparse.Namespace) -> Iterator[Callable[[str], None]]:
    """A live line on the terminal (stderr) while a command works, gone when it ends: nothing
    with --json, or when stderr is not a terminal (a pipe, a file, a CI log)."""
    if getattr(args, "json", False) or not sys.stderr.isatty():
        yield lambda message: None
        return
    with Console(stderr=True).status("starting", spinner="line") as live:
        yield live.update


def run_logs(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    try:
        with progress_line(args) as progress:
            path, index, code = logs_command.collect_bundle(
                stack.topology, transport, args.out, since=args.since, selectors=args.role,
                timeout=args.timeout, on_progress=progress)
    except ValueError as error:
        print(f"kimipd logs: {error}", file=sys.stderr)
        return DEGRADED
    if args.json:
        print(json.dumps(index | {"bundle": str(path)}, indent=2))
        return code
    files = index["files"]
    size = path.stat().st_size
    print(f"bundle: {path} ({len(index['containers'])} containers on {len(index['nodes'])} "
          f"nodes, {sum(1 for f in files if f['status'] != 'absent')} files, "
          f"{size / 1e6:.2f} MB, {index['seconds']}s)")
    # One line per tool and outcome, not per node: eight nodes without ibstat is one fact.
    noted: dict[str, list[str]] = {}
    for entry in files:
        if entry["status"] == "absent":
            noted.setdefault(f"absent: {entry['what']}", []).append(entry["node"])
        elif entry["status"] == "nonzero":
            noted.setdefault(f"exit {entry['exit_status']}: {entry['what']} ({entry['error']}; "
                             "output kept)", []).append(entry["node"])
    for what, nodes in noted.items():
        print(f"{what} on {', '.join(nodes)}")
    failed = [f for f in files if f["status"] == "failed"]
    for entry in failed:
        print(f"failed: {entry['path']} ({entry['what']}): {entry['error']}")
    print(f"{len(failed)} failed; exit {code}")
    return code


def run_verify(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    with progress_line(args) as progress:
        report = verify_command.run(stack.topology, stack.verification, transport,
                                    timeout=args.timeout, via=args.via, seed=args.seed,
                                    only=args.only, api_key=stack.router_api_key,
                                    tls=status_command.door_tls(stack), on_progress=progress)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        console().print(verify_command.render(report))
    return report.exit_code


def run_orphans(args: argparse.Namespace, stack: Stack, transport: Transport) -> int:
    try:
        export = (json.loads(Path(args.state_json).read_text()) if args.state_json
                  else StackReader(args.stack, args.cwd).export())
    except (StackError, OSError, json.JSONDecodeError) as error:
        print(f"kimipd: the stack's state cannot be read: {error}", file=sys.stderr)
        return DOWN
    if stack.roles_problem is not None:
        # Which containers are this stack's is the config's to say (another stack's may share
        # the nodes): with a config the program would refuse, none is judged, none removed.
        print("kimipd: orphans judges containers by the roles the stack's config defines, and "
              f"the config does not validate; fix it first: {stack.roles_problem}",
              file=sys.stderr)
        return DOWN
    known = orphans_command.known_container_ids(export)
    # The config's nodes too: a killed first `up` leaves no outputs to name them.
    nodes = sorted({*stack.access.nodes, *stack.topology.nodes})
    scanned = orphans_command.scan(nodes, transport, args.timeout)
    findings = orphans_command.find_orphans(scanned.containers, known, stack.roles)
    failures = (orphans_command.remove(findings, transport, args.timeout)
                if args.remove and findings else {})
    if args.json:
        print(json.dumps(orphans_command.as_json(findings, scanned, args.remove, failures),
                         indent=2))
    else:
        if findings:
            console().print(orphans_command.render(findings, scanned, stack.topology.stack))
        else:
            print(f"stack {stack.topology.stack}: no orphans among "
                  f"{len(scanned.containers)} kimipd container(s) on {len(nodes)} node(s)")
        for node, error in {**scanned.unreachable, **failures}.items():
            print(f"{node}: {error}", file=sys.stderr)
        if findings and args.remove and not failures:
            print(f"removed {len(findings)} container(s); {orphans_command.NEXT_STEPS}")
        elif findings and not args.remove:
            print(f"kimipd orphans --remove removes them; {orphans_command.NEXT_STEPS}")
    if scanned.unreachable or failures or (findings and not args.remove):
        return DEGRADED
    return OK


def run_targets(args: argparse.Namespace) -> int:
    """No SSH and no config: only the stack's outputs."""
    try:
        outputs = read_outputs(json.loads(Path(args.outputs_json).read_text())
                               if args.outputs_json
                               else StackReader(args.stack, args.cwd).outputs())
    except (StackError, OutputsError) as error:
        print(f"kimipd: {error}", file=sys.stderr)
        return DOWN
    targets = outputs.prometheus_targets or []
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(targets, indent=2) + "\n")
    partial.replace(args.out)
    print(f"{args.out}: {sum(len(entry['targets']) for entry in targets)} targets")
    if not targets:
        print("kimipd targets: the stack lists none; set kimipd:metrics.enabled true and "
              "`pulumi up`", file=sys.stderr)
        return DEGRADED
    return OK


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
