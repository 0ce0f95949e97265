"""Runs observability/__main__.py under Pulumi's mocks, with the serving stack's outputs as the
StackReference's answer, and records every registration (tests/program/harness.py's monitor)."""

from __future__ import annotations

import json
import logging
import runpy
from typing import Any

import pulumi
from pulumi.runtime.config import set_all_config

from observability.config import CONFIG_NAMESPACE
from tests.conftest import REPO, observability_stack_values
from tests.outputs import complete_outputs
from tests.program.harness import (PRIVATE_KEY, ClusterMocks, RecordingMonitor, Run, _Warnings,
                                   host_key_of)

IMAGE = "10.231.60.254:5000/kimipd/sim-observability@sha256:" + "ab" * 32


class ObservabilityMocks(ClusterMocks):
    """The serving stack's outputs, as the engine's StackReference read returns them."""

    def __init__(self, serving_outputs: dict[str, Any]) -> None:
        self.serving_outputs = serving_outputs
        self.references: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        if args.typ == "pulumi:pulumi:StackReference":
            self.references.append(args.inputs.get("name", args.name))
            return args.name, {"name": args.name, "outputs": self.serving_outputs,
                               "secretOutputNames": []}
        if args.typ == "docker:index/remoteImage:RemoteImage":
            return f"{args.name}-id", dict(args.inputs) | {"imageId": "sha256:" + "cd" * 32}
        return super().new_resource(args)


def observability_values(**changes: Any) -> dict[str, Any]:
    """observability/Pulumi.sim.yaml's values, the images set (as its set-up does)."""
    values = observability_stack_values("sim")
    values["prometheus"]["image"] = IMAGE
    values["alertmanager"]["image"] = IMAGE
    values["connection"].pop("knownHostsFile", None)
    values["node"]["hostKey"] = host_key_of(values["node"]["address"])
    values.update(changes)
    return values


def serving_outputs(targets: list[dict[str, Any]] | None = None, **more: Any) -> dict[str, Any]:
    """A 1P1D serving stack's outputs with metrics on (what components/cluster.py exports)."""
    if targets is None:
        targets = [{"targets": ["10.231.60.1:9003"],
                    "labels": {"stack": "sim", "role": "mooncake-master", "node": "10.231.60.1"}}]
        for mode, nodes in (("prefill", range(1, 5)), ("decode", range(5, 9))):
            for rank, n in enumerate(nodes):
                targets.append({"targets": [f"10.231.60.{n}:30000"], "labels": {
                    "stack": "sim", "role": f"{mode}-r{rank}", "group": mode, "mode": mode,
                    "rank": str(rank), "node": f"10.231.60.{n}"}})
    return complete_outputs({
        "prometheusTargets": targets, "serving": True,
        "verification": {"baseline": [], "tolerance": 0.1},
        "firewall": {"enabled": True, "table": "inet kimipd_31000",
                     "members": [f"10.231.60.{n}" for n in range(1, 9)],
                     "clientNetworks": ["0.0.0.0/0"], "monitoringHosts": [],
                     "operatorHosts": ["10.231.60.254"]}} | more)


def run_observability(values: dict[str, Any], outputs: dict[str, Any], *,
                      private_key: str | None = PRIVATE_KEY, private_key_secret: bool = True,
                      run: Run | None = None) -> tuple[Run, ObservabilityMocks]:
    """observability/__main__.py with these `kimipd-observability:*` values, as `pulumi up`."""
    run = Run() if run is None else run
    config = {f"{CONFIG_NAMESPACE}:{key}": value if isinstance(value, str) else json.dumps(value)
              for key, value in values.items()}
    secret_keys = []
    if private_key is not None:
        config[f"{CONFIG_NAMESPACE}:sshPrivateKey"] = private_key
        if private_key_secret:
            secret_keys.append(f"{CONFIG_NAMESPACE}:sshPrivateKey")
    set_all_config(config, secret_keys)
    logger = logging.getLogger("kimipd-test-observability")
    logger.propagate = False
    logger.handlers = [_Warnings(run)]
    mocks = ObservabilityMocks(outputs)
    monitor = RecordingMonitor(run)
    monitor.mocks = mocks
    pulumi.runtime.set_mocks(mocks, project="kimipd-observability", stack="test", preview=False,
                             logger=logger, monitor=monitor)

    @pulumi.runtime.test
    def program():
        module = runpy.run_path(str(REPO / "observability" / "__main__.py"), run_name="__main__")
        monitoring = module["monitoring"]
        exported = pulumi.Output.from_input({"prometheusUrl": monitoring.prometheus_url,
                                             "alertmanagerUrl": monitoring.alertmanager_url})

        def record(values: tuple[dict, bool]) -> None:
            run.stack_outputs, run.stack_outputs_secret = values

        return pulumi.Output.all(exported, exported.is_secret()).apply(record)

    program()
    return run, mocks


def run_observability_refused(values: dict[str, Any], outputs: dict[str, Any],
                              **kwargs: Any) -> tuple[str, Run]:
    run = Run()
    try:
        run_observability(values, outputs, run=run, **kwargs)
    except pulumi.RunError as error:
        return str(error), run
    raise AssertionError(f"the program accepted the stack ({len(run.resources)} resources)")
