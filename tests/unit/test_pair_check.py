"""The door's pair check beside each rust router (assets/router-launch.py): which workers make a
slot one the door may send to. The real smg behind it: test_router_members.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("router_launch",
                                                  REPO / "assets" / "router-launch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(mode: str, pairing: str, healthy: bool = True, status: str = "ready") -> dict:
    return {"worker_type": mode, "pd_pairing": pairing, "pairing_protocol": pairing,
            "is_healthy": healthy, "status": status}


def test_a_pair_needs_a_healthy_prefill_and_decode_of_one_contract() -> None:
    pairs = launcher().compatible_pairs
    assert pairs([worker("prefill", "c1"), worker("decode", "c1")]) == ["c1"]
    # Two contracts, one of each mode: what smg's /readiness calls ready, and no pair.
    assert pairs([worker("prefill", "c1"), worker("decode", "c2")]) == []
    # Unhealthy, or draining after its removal: not counted.
    assert pairs([worker("prefill", "c1"), worker("decode", "c1", healthy=False)]) == []
    assert pairs([worker("prefill", "c1"), worker("decode", "c1", status="draining")]) == []
    assert pairs([worker("prefill", "c1"), worker("prefill", "c2"), worker("decode", "c2"),
                  worker("decode", "c3")]) == ["c2"]


def test_the_launcher_reads_the_router_port_and_refuses_a_bad_argv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = launcher()
    assert module.option(["--host", "0.0.0.0", "--port", "31001"], "--port", "30000") == "31001"
    assert module.option(["--port"], "--port", "30000") == "30000"
    key = tmp_path / "key"
    key.write_text("k\n")
    monkeypatch.setattr(sys, "argv", ["router-launch.py", "--api-key-file", str(key),
                                      "--pair-check-port", "1"])
    with pytest.raises(SystemExit, match="usage: router-launch.py"):
        module.main()
