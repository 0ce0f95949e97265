"""A group's load bound: the config's, else from the load its gate measured at its last start."""

from __future__ import annotations

import pytest

from components.render import load_bound_seconds, measured_load_seconds

GATE_OUTPUT = """kimipd-decode-r0: waiting for http://10.0.0.5:30000/health: HTTP 000, 0s of 1800s
kimipd-decode-r0: waiting for http://10.0.0.5:30000/health: HTTP 503, 30s of 1800s
kimipd-decode-r0: healthy after 742s (http://10.0.0.5:30000/health)
model fingerprint: 0123456789ab
"""


def test_the_gate_s_healthy_line_is_the_measured_load() -> None:
    assert measured_load_seconds(GATE_OUTPUT) == 742


@pytest.mark.parametrize("stdout", ["", None, "kimipd-decode-r0 on 10.0.0.5: not healthy after "
                                    "1800s (http://10.0.0.5:30000/health answered 503)"])
def test_no_healthy_line_is_no_measure(stdout: str | None) -> None:
    assert measured_load_seconds(stdout) is None


@pytest.mark.parametrize(("configured", "measured", "bound"), [
    (40, 742, 40),      # the config's word stands
    (None, 742, 1484),  # twice the last load
    (None, 3, 120),     # never under the floor: the sim's stand-in loads in seconds
    (None, 1500, 1800),  # never over the gate's own timeout
    (None, None, 1800),  # nothing measured yet: the gate's timeout
])
def test_the_bound(configured: int | None, measured: int | None, bound: int) -> None:
    assert load_bound_seconds(configured, measured, gate_timeout=1800) == bound
