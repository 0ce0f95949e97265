"""The engine's step events of one `up`, split into the runbook's phases (pure, no engine)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pulumi import automation as auto

# In the order they run; each resource belongs to the first phase whose test it passes.
PHASES = (
    "preflight",
    "file copy",
    "image pull",
    "prepared image",
    "mc-master + gate",
    "prefill start + gate",
    "decode start + gate",
    "router + gate",
    "smoke test",
)
NODE_PREPARATION = PHASES[:4]


def phase_of(name: str, type_: str) -> str | None:
    """The phase of a resource by its (stable) name; components and providers have none."""
    if type_.startswith(("kimipd:", "pulumi:")):
        return None
    if name.startswith("node-"):
        # Rank containers are named by node and mode (node-10-231-60-5-decode).
        if name.endswith(("-prefill", "-decode")):
            return f"{name.rsplit('-', 1)[1]} start + gate"
        if name.endswith("-prepared-image"):
            return "prepared image"
        if name.endswith("-preflight"):
            return "preflight"
        if name.endswith(("-image", "-image-env")):
            return "image pull"
        return "file copy"  # -dirs, -script-*, -file-*
    for prefix, phase in (("mooncake-master", "mc-master + gate"),
                          ("prefill", "prefill start + gate"),
                          ("decode", "decode start + gate"),
                          ("router", "router + gate"),
                          ("smoke-test", "smoke test")):
        if name.startswith(prefix):
            return phase
    return None


@dataclass
class Step:
    name: str
    type: str
    op: str
    start: float  # seconds since the recorder started (when the event was read)
    end: float | None = None
    engine_start: int = 0  # the event's own timestamp (Unix seconds)


@dataclass
class Recorder:
    """An `on_event` callback: when each resource step began and ended.

    The engine stamps its events in whole seconds; the SDK reads its event log every 0.1 s, so
    the time an event is read here is the finer clock (and at most ~0.1 s late).
    """

    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)
    steps: dict[str, Step] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)  # urn -> first op other than same
    lag: list[float] = field(default_factory=list)  # read time - engine timestamp

    def __call__(self, event: auto.EngineEvent) -> None:
        now = time.monotonic() - self.t0
        if event.timestamp:
            self.lag.append(self.wall0 + now - event.timestamp)
        if event.resource_pre_event is not None:
            meta = event.resource_pre_event.metadata
            op = auto.OpType(meta.op).value
            name = meta.urn.rsplit("::", 1)[-1]
            self.steps.setdefault(meta.urn, Step(name, meta.type, op, now,
                                                 engine_start=event.timestamp))
            if op != "same":
                self.ops.setdefault(meta.urn, op)
        if event.res_outputs_event is not None:
            step = self.steps.get(event.res_outputs_event.metadata.urn)
            if step is not None:
                step.end = now

    def spans(self) -> dict[str, tuple[float, float]]:
        """phase -> (first step began, last step ended), seconds since the recorder started."""
        spans: dict[str, tuple[float, float]] = {}
        for step in self.steps.values():
            phase = phase_of(step.name, step.type)
            if phase is None or step.end is None:
                continue
            start, end = spans.get(phase, (step.start, step.end))
            spans[phase] = (min(start, step.start), max(end, step.end))
        return {phase: spans[phase] for phase in PHASES if phase in spans}

    def step(self, name: str, type_: str = "") -> Step:
        matches = [s for s in self.steps.values() if s.name == name and type_ in s.type]
        assert len(matches) == 1, f"{len(matches)} steps named {name!r}"
        return matches[0]


def change_counts(ops: dict[str, str]) -> dict[str, dict[str, int]]:
    """What a preview would do, by kind of resource: {kind: {replace|update|create|delete: n}}."""
    counts: dict[str, dict[str, int]] = {}
    for urn, op in ops.items():
        type_ = urn.split("::")[-2].split("$")[-1]  # the parent chain is joined with `$`
        name = urn.rsplit("::", 1)[-1]
        if type_.startswith(("kimipd:", "pulumi:")):
            continue
        kind = ("container" if type_.endswith("Container")
                else "gate check" if name.endswith(("-health", "-bootstrap"))
                else "smoke test" if name.startswith("smoke-test")
                else type_.rsplit(":", 1)[-1])
        verb = "replace" if "replace" in op else op
        counts.setdefault(kind, {}).setdefault(verb, 0)
        counts[kind][verb] += 1
    return counts
