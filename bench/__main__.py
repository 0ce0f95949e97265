"""scripts/bench: run the benchmarks, print one table, write it (and the raw figures) as JSON.

B1, B2, B3, B5, B6 and B7 drive the real engine against the simulated cluster, which other
engineers' tests share: run it under `flock -o /tmp/kimipd-sim-tests.lock`. B4 and B8 need no sim.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from sim.automation import REPO
from sim.cache import cache_dir

from .report import render, table_rows

ALL = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8")


def parse_args(argv: list[str]) -> argparse.Namespace:
    # __doc__ is None under python -OO
    parser = argparse.ArgumentParser(prog="scripts/bench",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per measurement, for min/median/max (default 3)")
    parser.add_argument("--out", type=Path,
                        default=Path(cache_dir()).expanduser() / "bench" / "latest.json",
                        help="where the JSON goes (default $KIMIPD_CACHE/bench/latest.json, "
                             "KIMIPD_CACHE defaulting to ~/.cache/kimipd)")
    parser.add_argument("--only", default=",".join(ALL),
                        help=f"comma-separated subset of {','.join(ALL)} (default: all)")
    parser.add_argument("--load-seconds", type=float, default=20.0,
                        help="the stand-in's model load time, prefill and decode (default 20)")
    parser.add_argument("--parallel", type=int, default=None,
                        help="the engine's --parallel (default: the engine's own default)")
    parser.add_argument("--gate-interval", type=float, default=None,
                        help="gates.intervalSeconds (default: Pulumi.sim.yaml's)")
    parser.add_argument("--orders", default="sequential,overlapped",
                        help="B1's start orders (default both)")
    parser.add_argument("--sizes", default="8,16,32,64",
                        help="B4's node counts (default 8,16,32,64)")
    parser.add_argument("--rate", type=float, default=None,
                        help="B6's and B7's load, requests per second through the router "
                             "(default: B6 10, every other one streamed; B7 20)")
    parser.add_argument("--plots", type=Path, default=REPO / "docs" / "bench",
                        help="where B6 draws its timelines, b6-KIND-SCENARIO.png (default "
                             "docs/bench)")
    args = parser.parse_args(argv)
    args.only = {part.strip().upper() for part in args.only.split(",") if part.strip()}
    unknown = args.only - set(ALL)
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ALL)}")
    args.orders = tuple(part.strip() for part in args.orders.split(",") if part.strip())
    if not args.orders or set(args.orders) - {"sequential", "overlapped"}:
        parser.error("--orders: sequential and/or overlapped")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.time()
    results: dict[str, object] = {}
    if args.only & {"B1", "B2", "B3", "B5"}:
        from .sim_bench import SimUnavailable, run_sim_benchmarks

        with tempfile.TemporaryDirectory(prefix="kimipd-bench-") as work:
            try:
                results |= run_sim_benchmarks(
                    Path(work), runs=args.runs, load_seconds=args.load_seconds,
                    parallel=args.parallel, gate_interval=args.gate_interval, only=args.only,
                    orders=args.orders)
            except SimUnavailable as error:
                print(f"bench: {error}", file=sys.stderr)
                return 1
    if "B4" in args.only:
        from .program_cost import measure

        results["B4"] = measure([int(s) for s in args.sizes.split(",")], args.runs)
    if "B8" in args.only:
        from . import verify_speeds

        results["B8"] = verify_speeds.measure(args.runs)
    # Benches under load, each with a table of its own.
    from . import availability, security

    benches = {
        "B6": (args.rate or 10.0, "through the door during each change, half streamed",
               availability.render,
               lambda work, rate: availability.measure(work, rate, args.plots.resolve())),
        "B7": (args.rate or 20.0, "for 30 s through the router, per setting", security.render,
               security.measure),
    }
    for name, (rate, what, render_table, measure_load) in benches.items():
        if name not in args.only:
            continue
        from .sim_bench import SimUnavailable

        with tempfile.TemporaryDirectory(prefix=f"kimipd-bench-{name.lower()}-") as work:
            try:
                results[name] = measure_load(Path(work), rate)
            except SimUnavailable as error:
                print(f"bench: {error}", file=sys.stderr)
                return 1
        print(f"{name}: {rate:g} requests/s {what}")
        print(render_table(results[name]))
    rows = table_rows({k: v for k, v in results.items() if k not in ("B6", "B7")},
                      args.load_seconds)
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    title = (f"kimipd bench {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))} on "
             f"{machine}; runs {args.runs}, load {args.load_seconds:g}s, parallel "
             f"{args.parallel or 'default'}, gate interval {args.gate_interval or 'stack'}; "
             f"{time.time() - started:.0f}s")
    print(title)
    print(render(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "title": title, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "machine": machine, "repo": str(REPO),
        "options": {"runs": args.runs, "load_seconds": args.load_seconds,
                    "parallel": args.parallel, "gate_interval": args.gate_interval,
                    "only": sorted(args.only)},
        "table": [dict(zip(("bench", "measurement", "min", "median", "max", "note"), row,
                           strict=True))
                  for row in rows],
        "results": results,
    }, indent=2, default=str))
    print(f"bench: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
