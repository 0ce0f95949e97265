"""B6: what clients see while the cluster changes, MiniLB beside the rust router.

For each router kind, a 2P2D stack on the sim (Pulumi.sim-2p2d.yaml with router.kind set) and
three changes, each `up` under a bounded open-loop load from this machine (RATE requests per
second, small /generate requests, only to the sim's router): (a) decode-b restarted (its
restartGeneration), (b) a node file edited (a new prepared image on every node: every group is
replaced), (c) a router-only change (one router flag). Per change: requests sent, failed by
status, p50/p99 latency, the wall time of the `up`, and the fewest healthy groups of each mode
seen during it (every group's rank 0 /health, probed from here every 0.2 s).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from components.config import read_stack_file
from sim.automation import REPO
from sim.cache import follow_cache

from .sim_bench import BENCH_ROUTER_KEY, SimBench, log

ROUTER = "http://10.231.60.5:31000"
API_KEY = BENCH_ROUTER_KEY  # what SimBench.new_stack sets as routerApiKey
KINDS = ("mini-lb", "rust")
CHANGES = ("decode-b restart", "node files (every group)", "router only")


class Load:
    """RATE requests per second until stopped, each on a pool thread: (status, seconds)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.results: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=64)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def _one(self) -> None:
        body = json.dumps({"text": "load", "sampling_params": {"max_new_tokens": 4}}).encode()
        request = urllib.request.Request(ROUTER + "/generate", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as failure:
            status = failure.code
        except OSError:
            status = 0
        with self._lock:
            self.results.append((status, time.monotonic() - started))

    def _run(self) -> None:
        interval, next_at = 1.0 / self.rate, time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._one)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)


class GroupWatch:
    """The fewest groups of each mode whose rank 0 answered /health 200, every 0.2 s."""

    def __init__(self, groups: dict[str, dict[str, Any]]) -> None:
        self.urls = {name: (group["mode"], f"http://{group['nodes'][0]}:30000/health")
                     for name, group in groups.items()}
        self.fewest = {"prefill": 99, "decode": 99}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            counts = Counter(mode for mode, url in self.urls.values() if self._healthy(url))
            for mode in self.fewest:
                self.fewest[mode] = min(self.fewest[mode], counts[mode])
            time.sleep(0.2)

    def __enter__(self) -> GroupWatch:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def edited_node_files(values: dict[str, Any], work: Path, tag: str) -> list[dict[str, Any]]:
    """The node files with the patch one comment longer: a new prepared image on every node."""
    files = copy.deepcopy(values["nodeFiles"])
    patch = next(f for f in files if f["destination"].endswith(".py"))
    source = Path(patch["source"]).expanduser()
    edited = work / f"{tag}-{source.name}"
    edited.write_bytes(source.read_bytes() + f"\n# bench {tag}\n".encode())
    patch |= {"source": str(edited), "sha256": hashlib.sha256(edited.read_bytes()).hexdigest()}
    return files


def measure(work: Path, rate: float) -> dict[str, Any]:
    bench = SimBench(work, load_seconds=3, parallel=None, gate_interval=None)
    results: dict[str, Any] = {}
    for kind in KINDS:
        values = follow_cache(read_stack_file(REPO / "Pulumi.sim-2p2d.yaml"))
        values["image"] = bench.sim["KIMIPD_SIM_IMAGE"]
        values["router"]["kind"] = kind
        if kind == "mini-lb":
            values["router"] = {k: v for k, v in values["router"].items()
                                if k in ("node", "kind", "port")}
        name = f"b6-{kind}"
        bench.remove_containers()
        stack = bench.new_stack(name, values)
        log(f"B6 {kind}: first up")
        stack.up()
        changes = {
            CHANGES[0]: {"groups": {**values["groups"], "decode-b": {
                **values["groups"]["decode-b"], "restartGeneration": 1}}},
            CHANGES[1]: {"nodeFiles": edited_node_files(values, work, kind)},
            CHANGES[2]: {"router": {**values["router"], "extraArgs": ["--log-level", "warn"]}},
        }
        for label, change in changes.items():
            bench.project.update_stack(name, change)
            with GroupWatch(values["groups"]) as watch, Load(rate) as load:
                started = time.monotonic()
                stack.up()
                wall = time.monotonic() - started
            statuses = Counter(status for status, _ in load.results)
            latencies = [seconds for status, seconds in load.results if status == 200]
            row = {
                "sent": len(load.results),
                "failed": {str(s): n for s, n in sorted(statuses.items()) if s != 200},
                "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
                "up_seconds": wall, "fewest_healthy": dict(watch.fewest),
            }
            log(f"B6 {kind} {label}: {row}")
            results[f"{kind} | {label}"] = row
        stack.destroy()
        stack.workspace.remove_stack(name)
    bench.remove_containers()
    return results


def rows(results: dict[str, Any]) -> list[list[str]]:
    """The B6 table of docs/bench.md: router, change, sent, failed (by status), p50/p99 s, up s,
    fewest P/D."""
    table = []
    for key, row in results.items():
        kind, change = key.split(" | ")
        failed = sum(row["failed"].values())
        by_status = ", ".join(f"{s}: {n}" for s, n in row["failed"].items()) or "-"
        fewest = row["fewest_healthy"]
        table.append([kind, change, str(row["sent"]), f"{failed} ({by_status})",
                      f"{row['p50'] or 0:.2f} / {row['p99'] or 0:.2f}", f"{row['up_seconds']:.0f}",
                      f"{fewest['prefill']} / {fewest['decode']}"])
    return table


def render(results: dict[str, Any]) -> str:
    header = ["router", "change", "sent", "failed (by status)", "p50 / p99 s", "up s",
              "fewest healthy P / D"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    return "\n".join(lines)

