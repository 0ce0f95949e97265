"""`scripts/kimipd targets`: the prometheusTargets output as a file_sd file."""

from __future__ import annotations

import json
from pathlib import Path

from components.config import load_cluster_config
from components.render import prometheus_targets
from ops import DEGRADED, DOWN, OK
from ops.cli import main
from tests.conftest import stack_values
from tests.outputs import complete_outputs


def test_targets_writes_the_stacks_file_sd_document(tmp_path: Path, capsys) -> None:
    targets = prometheus_targets(load_cluster_config(stack_values("sim-2p2d")), "sim-2p2d")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(complete_outputs({"prometheusTargets": targets})))
    out = tmp_path / "kimipd.json"
    assert main(["targets", "--outputs-json", str(outputs), "--out", str(out)]) == OK
    assert json.loads(out.read_text()) == targets
    assert not (tmp_path / "kimipd.json.partial").exists()
    # The Mooncake master, every rank of the four groups, each door node's exporter and each
    # slot router's metrics port.
    assert f"{out}: 13 targets" in capsys.readouterr().out
    groups = {entry["labels"].get("group") for entry in targets}
    assert groups == {None, "prefill-a", "prefill-b", "decode-a", "decode-b"}


def test_targets_without_metrics_say_how_to_turn_them_on(tmp_path: Path, capsys) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(complete_outputs({"prometheusTargets": []})))
    out = tmp_path / "kimipd.json"
    assert main(["targets", "--outputs-json", str(outputs), "--out", str(out)]) == DEGRADED
    assert json.loads(out.read_text()) == []
    assert "kimipd:metrics.enabled true" in capsys.readouterr().err


def test_outputs_of_another_version_are_refused(tmp_path: Path, capsys) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"prometheusTargets": []}))
    out = tmp_path / "targets.json"
    assert main(["targets", "--outputs-json", str(outputs), "--out", str(out)]) == DOWN
    assert "outputs are of version None" in capsys.readouterr().err and not out.exists()
