"""/metrics: SGLang 0.5.19's series (sglang/srt/observability/metrics_collector.py), written by
prometheus_client as SGLang's own /metrics is.

Each HTTP server has its own CollectorRegistry: rank 0's API server (the scheduler gauges, the
tokenizer manager's counters and time-to-first-token histogram, the stand-in's own two series)
and the dummy health server of ranks >= 1 (the scheduler gauges, at 0). The collectors read the
rank's state at scrape time, under its lock.

As SGLang's multiprocess registry answers: no `_created` series, and a labelled counter or
histogram has no series until its first observation (prometheus_client writes the labels sorted
by name, `le` among them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from .state import Standin


def _values(names: List[str], labels: Dict[str, Any]) -> List[str]:
    return [str(labels[n]) for n in names]


def _scheduler_gauges(st: "Standin", running: int, queued: int) -> Iterator[Metric]:
    labels = st.scheduler_labels()
    names = sorted(labels)
    for name, doc, value in (
        ("sglang:num_running_reqs", "The number of running requests.", running),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queued),
    ):
        gauge = GaugeMetricFamily(name, doc, labels=names)
        gauge.add_metric(_values(names, labels), value)
        yield gauge


class _ApiCollector:
    """Rank 0's series."""

    def __init__(self, st: "Standin") -> None:
        self.st = st

    def collect(self) -> Iterator[Metric]:
        st = self.st
        ready = 1 if st.not_ready_reason() is None else 0  # takes the lock itself
        with st.lock:
            running = st.num_running_reqs
            served = {k: dict(v) for k, v in st.served.items()}
            ttft = {k: (list(h[0]), h[1]) for k, h in st.ttft.items()}
            num_requests = st.num_requests
            mismatches = st.kv_contract_mismatches
        yield from _scheduler_gauges(st, running=running, queued=0)

        # The tokenizer manager's series, one per is_streaming ("false"/"true") seen so far.
        tok = dict(st.common_labels(), **st.extra_labels())
        names = sorted(dict(tok, is_streaming=""))
        for name, doc, key in (
            ("sglang:prompt_tokens_total", "Number of prefill tokens processed.", "prompt"),
            ("sglang:generation_tokens_total", "Number of generation tokens processed.",
             "generation"),
            ("sglang:num_requests_total", "Number of requests processed.", "requests"),
        ):
            counter = CounterMetricFamily(name, doc, labels=names)
            for stream in sorted(served):
                counter.add_metric(_values(names, dict(tok, is_streaming=stream)),
                                   served[stream][key])
            yield counter
        hist = HistogramMetricFamily("sglang:time_to_first_token_seconds",
                                     "Histogram of time to first token in seconds.", labels=names)
        for stream in sorted(ttft):
            counts, total = ttft[stream]
            cumulative, buckets = 0, []
            for bound, n in zip(list(st.ttft_buckets) + [math.inf], counts):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            hist.add_metric(_values(names, dict(tok, is_streaming=stream)), buckets, total)
        yield hist

        # The stand-in's own.
        model = [str(st.args.served_model_name)]
        requests = CounterMetricFamily(
            "sglang:standin_requests_total",
            "Generation requests the stand-in accepted (HTTP requests).", labels=["model_name"])
        requests.add_metric(model, num_requests)
        yield requests
        ready_gauge = GaugeMetricFamily(
            "sglang:standin_ready", "1 when rank 0 reports healthy (/health 200), else 0.",
            labels=["model_name"])
        ready_gauge.add_metric(model, ready)
        yield ready_gauge
        # A test oracle, not SGLang's: KV of another contract this decode received (contract.py).
        mismatch = CounterMetricFamily(
            "sglang:standin_kv_contract_mismatch",
            "KV received from a prefill of another KV contract (the stand-in's test oracle).",
            labels=["model_name"])
        mismatch.add_metric(model, mismatches)
        yield mismatch


class _DummyHealthCollector:
    """Ranks >= 1: the scheduler gauges of the node's first scheduler; no traffic reaches it."""

    def __init__(self, st: "Standin") -> None:
        self.st = st

    def collect(self) -> Iterator[Metric]:
        yield from _scheduler_gauges(self.st, running=0, queued=0)


def api_registry(st: "Standin") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ApiCollector(st))
    return registry


def dummy_health_registry(st: "Standin") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DummyHealthCollector(st))
    return registry


# What SGLang's /metrics answers a plain scrape with (prometheus_client's text format 0.0.4).
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


def exposition(registry: CollectorRegistry, accept: Optional[str]) -> Tuple[bytes, str]:
    """The body and content type of /metrics: text format 0.0.4, whatever the scraper's Accept
    says. (prometheus_client's OpenMetrics writer, which Prometheus asks for first, spells
    `sglang:` names with an underscore since its UTF-8 name escaping, so Prometheus would store
    `sglang_generation_tokens_total`; the series the rules and tests read are the colon names.)"""
    del accept
    return generate_latest(registry), TEXT_0_0_4
