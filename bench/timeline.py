"""B6's timeline of one scenario: what was recorded while it ran, and its drawing.

The samples are plain data (JSON in the bench's output), recorded during the run; `draw` is a
pure function of them. Times are seconds since the scenario's start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("prefill", "decode")


@dataclass
class Timeline:
    title: str
    seconds: float  # the scenario's length
    # (sent, whole answer): every request of the load.
    requests: list[tuple[float, bool]] = field(default_factory=list)
    # (t, slots UP at the door; None: its exporter did not answer).
    door: list[tuple[float, int | None]] = field(default_factory=list)
    # (t, prefill groups healthy, decode groups healthy): each group's rank 0 /health.
    groups: list[tuple[float, int, int]] = field(default_factory=list)
    # (t, unit, resource): an engine step of a unit (a group, router-a, router-b, the door)
    # began or ended (its resource_pre or res_outputs event).
    steps: list[tuple[float, str, str]] = field(default_factory=list)
    # (t, what): the scenario's own moments (up started, up done, kill, heal ...).
    events: list[tuple[float, str]] = field(default_factory=list)


def per_second(requests: list[tuple[float, bool]], seconds: float) -> dict[str, list[int]]:
    """Requests by the second they were sent in, `ok` (a whole answer) and `failed`; one bucket
    per started second of SECONDS, a request outside them in the nearest."""
    buckets = max(1, math.ceil(seconds))
    counts = {"ok": [0] * buckets, "failed": [0] * buckets}
    for sent, ok in requests:
        counts["ok" if ok else "failed"][min(buckets - 1, max(0, int(sent)))] += 1
    return counts


def unit_spans(steps: list[tuple[float, str, str]]) -> list[tuple[str, float, float]]:
    """(unit, first step began, last step ended) per unit, in the order they began."""
    spans: dict[str, tuple[float, float]] = {}
    for t, unit, _ in steps:
        start, end = spans.get(unit, (t, t))
        spans[unit] = (min(start, t), max(end, t))
    return sorted(((unit, start, end) for unit, (start, end) in spans.items()),
                  key=lambda span: (span[1], span[0]))


def draw(timeline: Timeline, path: Path) -> None:
    """Three panels over the scenario's seconds: requests per second by outcome, slots UP at the
    door, healthy groups per mode; each unit's engine steps (first began: solid, last ended:
    dashed) and the scenario's events (dotted) across all three. A PNG at PATH."""
    # Figure without pyplot: no display backend, no global state (Agg renders the PNG).
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 7.5), layout="constrained")
    rate_ax, door_ax, group_ax = figure.subplots(3, 1, sharex=True,
                                                 height_ratios=[2.0, 1.0, 1.0])
    counts = per_second(timeline.requests, timeline.seconds)
    seconds = list(range(len(counts["ok"])))
    rate_ax.bar(seconds, counts["ok"], width=1.0, align="edge", color="tab:green", label="ok")
    rate_ax.bar(seconds, counts["failed"], width=1.0, align="edge", bottom=counts["ok"],
                color="tab:red", label="failed")
    rate_ax.set_ylabel("requests/s\n(by send time)")
    # Head room for the events' labels.
    busiest = max((ok + failed for ok, failed in zip(counts["ok"], counts["failed"],
                                                     strict=True)), default=0)
    rate_ax.set_ylim(0, max(1, busiest) * 1.7)

    times = [t for t, _ in timeline.door]
    door_ax.step(times, [math.nan if up is None else up for _, up in timeline.door],
                 where="post", color="tab:blue")
    door_ax.set_ylabel("slots UP\nat the door")
    door_ax.set_ylim(-0.2, 2.4)
    door_ax.set_yticks([0, 1, 2])

    times = [sample[0] for sample in timeline.groups]
    for index, (mode, color) in enumerate(zip(MODES, ("tab:purple", "tab:orange"),
                                              strict=True)):
        # Decode drawn a little lower, so that equal counts stay apart.
        offset = -0.06 * index
        group_ax.step(times, [sample[1 + index] + offset for sample in timeline.groups],
                      where="post", color=color, label=mode)
    group_ax.set_ylabel("healthy groups\n(rank 0 /health)")
    group_ax.set_ylim(-0.3, 2.4)
    group_ax.set_yticks([0, 1, 2])
    group_ax.legend(loc="lower left", fontsize="small")
    group_ax.set_xlabel("seconds since the scenario's start")
    group_ax.set_xlim(0, max(1.0, timeline.seconds))

    palette = ("tab:cyan", "tab:olive", "tab:brown", "tab:pink", "tab:gray", "navy",
               "darkgreen", "crimson")
    handles, _ = rate_ax.get_legend_handles_labels()
    for index, (unit, start, end) in enumerate(unit_spans(timeline.steps)):
        color = palette[index % len(palette)]
        for axis in (rate_ax, door_ax, group_ax):
            axis.axvline(start, color=color, linewidth=1.2)
            axis.axvline(end, color=color, linewidth=1.2, linestyle="--")
        handles.append(rate_ax.plot([], [], color=color,
                                    label=f"{unit}: {start:.1f}-{end:.1f}s")[0])
    for t, what in timeline.events:
        for axis in (rate_ax, door_ax, group_ax):
            axis.axvline(t, color="black", linewidth=1.0, linestyle=":")
        rate_ax.annotate(what, (t, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                         fontsize="x-small", va="top", ha="right",
                         bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8,
                               "pad": 1})
    figure.legend(handles=handles, loc="outside right upper", fontsize="small",
                  title="requests; engine steps\n(begin solid, end dashed)")
    figure.suptitle(timeline.title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
