"""The run's budget as scripts/test reports it (tests/run_times.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.run_times import BUDGET_SECONDS, main, module_times, report

TIMES = {"tests/integration/test_door.py": 400.0, "tests/integration/test_up.py": 100.0,
         "tests/integration/test_faults.py": 250.0, "sim/standin/tests/test_pacing.py": 20.0}


def test_within_the_budget_every_module_is_listed_slowest_first_and_nothing_is_warned() -> None:
    lines, warnings = report(TIMES, BUDGET_SECONDS - 1)
    assert [line.split()[-1] for line in lines[:4]] == [
        "tests/integration/test_door.py", "tests/integration/test_faults.py",
        "tests/integration/test_up.py", "sim/standin/tests/test_pacing.py"]
    assert "770.0 s  the engine modules in all (every session)" in [line.strip() for line in lines]
    assert warnings == []


def test_past_the_budget_the_warning_names_the_three_slowest() -> None:
    _, warnings = report(TIMES, BUDGET_SECONDS + 1)
    assert len(warnings) == 1
    assert "past the budget of 2100 s" in warnings[0]
    assert ("test_door.py (400 s), tests/integration/test_faults.py (250 s), "
            "tests/integration/test_up.py (100 s)") in warnings[0]
    assert "test_pacing" not in warnings[0]


def test_a_session_that_wrote_no_times_still_gets_the_wall_time(tmp_path: Path) -> None:
    assert module_times(tmp_path / "missing.json") == {}
    (tmp_path / "torn.json").write_text("{")
    assert module_times(tmp_path / "torn.json") == {}
    lines, warnings = report({}, BUDGET_SECONDS + 60)
    assert "none recorded" in warnings[0] and f"{BUDGET_SECONDS + 60:.1f} s  the whole run" in lines[-1].strip()


def test_the_command_warns_on_both_streams_and_exits_zero(tmp_path: Path) -> None:
    times = tmp_path / "times.json"
    times.write_text(json.dumps(TIMES))
    result = subprocess.run([sys.executable, "-m", "tests.run_times", str(times),
                             str(BUDGET_SECONDS + 300)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    assert "wall time per engine module" in result.stdout
    assert f"WARNING: the run took {BUDGET_SECONDS + 300} s" in result.stdout
    assert f"WARNING: the run took {BUDGET_SECONDS + 300} s" in result.stderr


def test_both_engine_sessions_files_are_read_together(tmp_path, capsys) -> None:
    big, small = tmp_path / "big.json", tmp_path / "small.json"
    big.write_text(json.dumps({"tests/integration/test_door.py": 400.0}))
    small.write_text(json.dumps({"tests/integration/test_faults.py": 250.0}))
    assert main([str(big), str(small), str(tmp_path / "absent.json"), "1200"]) == 0
    out = capsys.readouterr().out
    assert "test_door.py" in out and "test_faults.py" in out
    assert "650.0 s  the engine modules in all (every session)" in out
