"""The benchmark's one table: rows of (bench, measurement, min, median, max, note)."""

from __future__ import annotations

import statistics
from typing import Any

from .phases import PHASES
from .verify_speeds import rows as b8_rows

Row = tuple[str, str, float | None, float | None, float | None, str]


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def bound(runs: list[dict[str, Any]], order: str) -> dict[str, float]:
    """The critical path with no waiting between phases, each part at its measured minimum:
    preparation + mc-master + P + D (sequential) or max(P, D) (overlapped) + router + smoke, where
    P and D are the prefill and decode phases (container created to gate passed; the stand-in's
    configured load is most of each)."""
    def fastest(phase: str) -> float:
        return min(run["phases"][phase]["seconds"] for run in runs)

    prefill, decode = fastest("prefill start + gate"), fastest("decode start + gate")
    parts: dict[str, float] = {
        "preparation": min(run["preparation_done_at"] for run in runs),
        "mc-master": fastest("mc-master + gate"),
        "P": prefill,
        "D": decode,
        "serving groups": prefill + decode if order == "sequential" else max(prefill, decode),
        "router": fastest("router + gate"),
        "smoke": fastest("smoke test"),
    }
    total = sum(parts[k] for k in ("preparation", "mc-master", "serving groups", "router",
                                   "smoke"))
    return parts | {"total": total}


LAUNCH_STEPS = ("started", "launch.sh done", "server up", "group joined", "loaded", "ready",
                "gate done")


def launch_row(order: str, group: str, launches: list[dict[str, float]]) -> Row:
    """Rank 0 from container creation to its gate: each step's median length."""
    previous, parts = 0.0, []
    for step in LAUNCH_STEPS:
        if all(step in launch for launch in launches):
            at = statistics.median(launch[step] for launch in launches)
            parts.append(f"{step} +{at - previous:.1f}")
            previous = at
    return ("B1", f"{order}: {group} r0 created -> gate done",
            *spread([launch["gate done"] for launch in launches]), "s: " + ", ".join(parts))


def b1_rows(b1: dict[str, list[dict[str, Any]]], load_seconds: float) -> list[Row]:
    rows: list[Row] = []
    for order, runs in b1.items():
        for phase in PHASES:
            durations = [run["phases"][phase]["seconds"] for run in runs if phase in run["phases"]]
            if not durations:
                continue
            starts = [run["phases"][phase]["start"] for run in runs]
            rows.append(("B1", f"{order}: {phase}", *spread(durations),
                         f"s, starts at +{statistics.median(starts):.1f}"))
        for group in ("prefill", "decode"):
            rows.append(launch_row(order, group, [run["launch"][group] for run in runs]))
        serving = [run["serving_at"] for run in runs]
        rows.append(("B1", f"{order}: time to serve", *spread(serving),
                     "s from `up` to the smoke test's answer"))
        rows.append(("B1", f"{order}: up wall time", *spread([r["up_seconds"] for r in runs]),
                     "s"))
        lead = [run["decode_lead_seconds"] for run in runs]
        rows.append(("B1", f"{order}: decode created before prefill healthy", *spread(lead),
                     "s (negative: after)"))
        parts = bound(runs, order)
        groups = "P + D" if order == "sequential" else "max(P, D)"
        rows.append(("B1", f"{order}: critical-path bound", None, parts["total"], None,
                     f"s = prep {parts['preparation']:.1f} + mc {parts['mc-master']:.1f} + "
                     f"{groups} (P {parts['P']:.1f}, D {parts['D']:.1f}; load "
                     f"{load_seconds:g} each) + router {parts['router']:.1f} + smoke "
                     f"{parts['smoke']:.1f}"))
        ratios = [s / parts["total"] for s in serving]
        target = " (target <= 1.10)" if order == "overlapped" else ""
        rows.append(("B1", f"{order}: time to serve / bound", *spread(ratios), target.strip()))
    if {"sequential", "overlapped"} <= b1.keys():
        seq = statistics.median(r["serving_at"] for r in b1["sequential"])
        ovl = statistics.median(r["serving_at"] for r in b1["overlapped"])
        rows.append(("B1", "overlapped saves (median)", None, seq - ovl, None,
                     f"s of {seq:.1f}"))
    return rows


def table_rows(results: dict[str, Any], load_seconds: float) -> list[Row]:
    rows: list[Row] = []
    if "B1" in results:
        rows += b1_rows(results["B1"], load_seconds)
    if "B2" in results:
        count = results["B2"]["resources"]
        for name, times in results["B2"]["seconds"].items():
            rows.append(("B2", name, *spread(times),
                         f"s, the last B1 stack ({count} resources in its state)"))
    if "B3" in results:
        smallest = min(results["B3"], key=int)
        base = statistics.median(r["up_seconds"] for r in results["B3"][smallest])
        for size, runs in results["B3"].items():
            walls = [r["up_seconds"] for r in runs]
            step = statistics.median(r["preflight_step_seconds"] for r in runs)
            rows.append(("B3", f"prepare {size} nodes (serving false)", *spread(walls),
                         f"s, x{statistics.median(walls) / base:.2f} of {smallest} nodes; "
                         f"preflight step {step:.1f}s per node"))
    if "B4" in results:
        for size, runs in results["B4"].items():
            rss = max(r["peak_rss_mib"] for r in runs)
            own = max(r["program_rss_mib"] for r in runs)
            rows.append(("B4", f"preview {size} nodes under mocks",
                         *spread([r["seconds"] for r in runs]),
                         f"s, {runs[0]['resources']} registrations, peak RSS {rss:.0f} MiB "
                         f"(+{own:.0f} MiB over the imports)"))
    if "B5" in results:
        for kind, verbs in sorted(results["B5"].items()):
            for verb, count in sorted(verbs.items()):
                rows.append(("B5", f"decode-only edit: {kind} {verb}", None, count, None,
                             "resources in the preview"))
    if "B8" in results:
        rows += b8_rows(results["B8"])
    return rows


def render(rows: list[Row]) -> str:
    def cell(value: float | None) -> str:
        if value is None:
            return ""
        return f"{value:g}" if float(value).is_integer() else f"{value:.2f}"

    header = ("bench", "measurement", "min", "median", "max", "note")
    body = [(b, m, cell(lo), cell(mid), cell(hi), note) for b, m, lo, mid, hi, note in rows]
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(5)]
    lines = []
    for row in [header, *body]:
        numbers = [str(v).rjust(w) for v, w in zip(row[2:5], widths[2:5], strict=True)]
        lines.append("  ".join([str(row[0]).ljust(widths[0]), str(row[1]).ljust(widths[1]),
                                *numbers, row[5]]).rstrip())
    return "\n".join(lines)

