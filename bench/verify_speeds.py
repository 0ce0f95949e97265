"""B8: `kimipd verify`'s figures against the stand-in's configured speeds, on loopback (no sim).

A stand-in prefill and decode group (one rank each) behind the real sglang-router's MiniLB, as
tests/ops/test_verify.py starts them: prefill at 2000 prompt tokens/s, decode at 150 output
tokens/s. `kimipd verify`'s requests (medium and long; warmup is not timed) go to the router
directly and over the tests' fake SSH transport (`curl -N` on this machine). On an idle machine
each figure is within 10 % of the configured speed, and the first token comes within a few
tenths of a second of the configured prefill time (the router hop). The tests assert only floors
and wide ceilings, which a busy machine cannot break; this prints the figures themselves.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from components.config import VerificationSpec
from ops import OK
from ops.topology import Topology
from ops.verify import run

PREFILL_RATE = 2000.0  # prompt tokens/s
DECODE_RATE = 150.0  # output tokens/s
VIAS = ("direct", "ssh")


def measure(runs: int) -> dict[str, Any]:
    """Per way of reaching the router and per request: the measured prefill and decode
    tokens/s and how late the first token came after the configured prefill time, RUNS each."""
    # The tests' loopback deployment (processes stopped whatever happens).
    from tests.ops.loopback import LocalNodes, start_cluster, stop_cluster

    figures: dict[str, dict[str, dict[str, list[float]]]] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kimipd-bench-b8-") as work:
        cluster = start_cluster(
            Path(work), ranks=1,
            prefill_env={"SGLANG_STANDIN_PREFILL_TOKENS_PER_S": str(PREFILL_RATE)},
            decode_env={"SGLANG_STANDIN_DECODE_TOKENS_PER_S": str(DECODE_RATE)})
        try:
            topology = Topology.from_outputs("loopback", cluster.outputs())
            for attempt in range(runs):
                for via in VIAS:
                    nodes = LocalNodes(cluster.containers()) if via == "ssh" else None
                    report = run(topology, VerificationSpec(), transport=nodes, via=via,
                                 seed=attempt)
                    if report.exit_code != OK:
                        failures.append(f"{via} run {attempt + 1}: {report.verdict} "
                                        f"{[m.problems for m in report.measurements]}")
                        continue
                    for m in report.measurements:
                        if m.shape.name == "warmup" or m.ttft is None:
                            continue
                        entry = figures.setdefault(via, {}).setdefault(
                            m.shape.name, {"prefill": [], "decode": [], "late": []})
                        entry["prefill"].append(m.prefill_tokens_per_second or 0.0)
                        entry["decode"].append(m.decode_tokens_per_second or 0.0)
                        entry["late"].append(m.ttft - m.shape.input_tokens / PREFILL_RATE)
        finally:
            stop_cluster(cluster)
    return {"prefill_rate": PREFILL_RATE, "decode_rate": DECODE_RATE, "figures": figures,
            "failures": failures}


def rows(b8: dict[str, Any]) -> list[tuple[str, str, float | None, float | None, float | None,
                                           str]]:
    """The table's rows: each figure's min / median / max and its median's distance from the
    configured speed."""
    found = []
    configured = {"prefill": b8["prefill_rate"], "decode": b8["decode_rate"]}
    for via, shapes in b8["figures"].items():
        for shape, entry in shapes.items():
            for kind in ("prefill", "decode"):
                values = entry[kind]
                off = statistics.median(values) / configured[kind] - 1
                found.append(("B8", f"verify {via}: {shape} {kind}", min(values),
                              statistics.median(values), max(values),
                              f"tok/s, configured {configured[kind]:g} ({off:+.1%})"))
            late = entry["late"]
            found.append(("B8", f"verify {via}: {shape} first token late", min(late),
                          statistics.median(late), max(late),
                          "s after the configured prefill time (router hop, ssh)"))
    for failure in b8["failures"]:
        found.append(("B8", "verify failed", None, None, None, failure))
    return found
