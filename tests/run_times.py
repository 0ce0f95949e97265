"""The run's time budget, read at the end of `scripts/test`: the engine modules' wall times
(written by tests/conftest.py where KIMIPD_MODULE_TIMES names a file) and the whole run's.
Past the budget it warns, naming the slowest modules; the run still passes or fails on its
tests alone (docs/tests.md).

usage: python -m tests.run_times TIMES_FILE... WALL_SECONDS (a file per engine session)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# CI allows 90 minutes; the full run must stay under 35 of them on a fresh machine, set-up
# included. Past this, the slowest modules are named.
BUDGET_SECONDS = 35 * 60
SLOWEST_NAMED = 3


def module_times(path: Path) -> dict[str, float]:
    """MODULE -> seconds as the engine session wrote them; {} where the session wrote none."""
    try:
        return {str(key): float(value) for key, value in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}


def report(times: dict[str, float], wall_seconds: float,
           budget_seconds: float = BUDGET_SECONDS) -> tuple[list[str], list[str]]:
    """(the lines to print, the warnings): each engine module's time, slowest first, the run's
    wall time against the budget; a warning naming the slowest modules when over it."""
    lines = [f"{seconds:8.1f} s  {module}"
             for module, seconds in sorted(times.items(), key=lambda item: -item[1])]
    # The engine sessions run side by side: this sum is more than their wall time.
    lines.append(f"{sum(times.values()):8.1f} s  the engine modules in all (every session)")
    lines.append(f"{wall_seconds:8.1f} s  the whole run, set-up included "
                 f"(budget {budget_seconds:.0f} s)")
    warnings = []
    if wall_seconds > budget_seconds:
        slowest = sorted(times.items(), key=lambda item: -item[1])[:SLOWEST_NAMED]
        named = ", ".join(f"{module} ({seconds:.0f} s)" for module, seconds in slowest)
        warnings.append(
            f"WARNING: the run took {wall_seconds:.0f} s, past the budget of "
            f"{budget_seconds:.0f} s; the slowest engine modules: {named or 'none recorded'}. "
            "Share a stack or move a test to the small sim stack (docs/tests.md).")
    return lines, warnings


def main(argv: list[str]) -> int:
    times = {module: seconds for path in argv[:-1] for module, seconds in
             module_times(Path(path)).items()}
    lines, warnings = report(times, float(argv[-1]))
    print("\n===== wall time per engine module =====")
    print("\n".join(lines))
    for warning in warnings:
        print(warning)
        print(warning, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
