"""How an engine module reads `sim/sim status`: only its own nodes' rows, the registry's and the
image's count (the other engine session may have cut one of its nodes off on purpose)."""

from __future__ import annotations

from tests.integration.sim import SMALL_NODES, sim_status_problems

REPORT = """node   address       netns  sshd     containerd dockerd  ssh-login
node5  10.231.60.5   up     down     up         up       down
node9  10.231.60.9   up     up       up         up       up
node10 10.231.60.10  up     up       up         up       up
node11 10.231.60.11  up     up       up         up       up
node12 10.231.60.12  up     up       up         up       up
registry 10.231.60.254:5000 up
image    10.231.60.254:5000/kimipd/sim-node:d0175947c07c present
status: DOWN (something is not running)"""


def test_another_sessions_node_down_is_not_this_modules_problem() -> None:
    assert sim_status_problems(REPORT, SMALL_NODES) == []


def test_its_own_node_down_the_registry_or_the_image_is() -> None:
    (problem,) = sim_status_problems(REPORT, ["10.231.60.5", *SMALL_NODES])
    assert problem.startswith("node5 ")
    assert sim_status_problems(REPORT.replace(":5000 up", ":5000 down"), SMALL_NODES)
    assert sim_status_problems(REPORT.replace("present", "missing"), SMALL_NODES)
    assert sim_status_problems("", SMALL_NODES) == [f"{node}: no row" for node in SMALL_NODES]
