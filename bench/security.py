"""B7: what keys and the firewall cost a client, on the sim, through the real engine.

One 1P1D stack (Pulumi.sim.yaml) in three settings, each `up` in turn and then an open-loop load
of RATE small `/generate` requests per second for SECONDS from this machine: as stacks ran before
(MiniLB, no keys, no firewall), the keyed rust router without the firewall, and as shipped (keys
and firewall, this machine a plain client: no `operatorHosts`, so its requests take the door's
`clientNetworks` rule like anyone's). Prints sent, failed and latency percentiles per setting.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from components.config import read_stack_file
from sim.automation import REPO
from sim.cache import follow_cache

from .load import Load, percentile
from .sim_bench import BENCH_ROUTER_KEY, SimBench, log

ROUTER = "http://10.231.60.5:31000"
SETTINGS = ("before: MiniLB, no keys, no firewall", "rust router, keys, no firewall",
            "as shipped: keys and firewall")


def values_for(setting: str, image: str) -> dict[str, Any]:
    values = follow_cache(read_stack_file(REPO / "Pulumi.sim.yaml"))
    values["image"] = image
    if setting == SETTINGS[0]:
        values["router"] = {key: value for key, value in values["router"].items()
                            if key in ("node", "port")} | {"kind": "mini-lb"}
        values["firewall"] = {"enabled": False}
    elif setting == SETTINGS[1]:
        values["firewall"] = {"enabled": False}
    else:
        values["firewall"] = {"operatorHosts": []}
    return values


def measure(work: Path, rate: float, seconds: float = 30.0) -> dict[str, Any]:
    bench = SimBench(work, load_seconds=3, parallel=None, gate_interval=None)
    bench.remove_containers()
    stack = bench.new_stack("b7", values_for(SETTINGS[0], bench.sim["KIMIPD_SIM_IMAGE"]))
    results: dict[str, Any] = {}
    try:
        for setting in SETTINGS:
            bench.project.write_stack("b7", values_for(setting, bench.sim["KIMIPD_SIM_IMAGE"]))
            log(f"B7 {setting}: up")
            up_seconds, _ = bench.up(stack)
            time.sleep(2)  # the router's first health checks
            # Small answers, none streamed; the key is sent to MiniLB too, which ignores it.
            with Load(rate, ROUTER, BENCH_ROUTER_KEY, tokens=4, streams=False) as load:
                time.sleep(seconds)
            latencies = sorted(a.seconds for a in load.results if a.ok)
            results[setting] = {
                "sent": len(load.results),
                "failed": dict(Counter(a.outcome for a in load.results if not a.ok)),
                "p50": percentile(latencies, 0.5), "p90": percentile(latencies, 0.9),
                "p99": percentile(latencies, 0.99), "up_seconds": up_seconds,
            }
    finally:
        bench.drop(stack)
    return results


def render(results: dict[str, Any]) -> str:
    header = ["setting", "sent", "failed", "p50 / p90 / p99 ms", "up s"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for setting, row in results.items():
        failed = sum(row["failed"].values())
        millis = " / ".join(f"{(row[p] or 0) * 1000:.1f}" for p in ("p50", "p90", "p99"))
        lines.append(f"| {setting} | {row['sent']} | {failed} | {millis} | "
                     f"{row['up_seconds']:.0f} |")
    return "\n".join(lines)
