"""Healing a frozen rank without a human, through the real engine on the sim with the rust router
(stack file Pulumi.sim-2p2d.yaml, on test_rollout.py's stack): rank 1 of a two-node decode group
stopped (its process alive, its container running, answering nothing) under load, and
`reconcile --watch`, started from the systemd unit's own ExecStart line and environment file,
replaces exactly that group's containers. reconcile's other decisions (a dry run, a person's
window, `serving: false`, a lock, the heal limit) are test_heal_decisions.py's, on a small stack
beside these."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pulumi import automation as auto

from sim.automation import Project
from tests.integration.engine import (  # noqa: F401 - fixtures
    ROUTER, SHARED_2P2D, container_ids, shared_2p2d, shared_2p2d_project, shared_2p2d_sim,
    shared_2p2d_stack)
from tests.integration.healing import (
    decisions, heal_under_load, reconcile_service, stop_server)
from tests.integration.sim import SimCluster
from tests.ops.loopback import wait_until

pytestmark = pytest.mark.timeout(1800)

STACK = SHARED_2P2D
DECODE = {"decode-a": ("10.231.60.5", "10.231.60.6"), "decode-b": ("10.231.60.7", "10.231.60.8")}


@pytest.fixture(scope="class")
def frozen_service(project: Project, tmp_path_factory) -> Iterator[dict]:
    """The frozen-rank test's reconcile service, for the class (more tests of it share one:
    starting one, whose first pass refreshes the 8-node stack, costs half a minute). A test reads
    the decisions logged after it started (`decisions(log, since)`)."""
    # Ten: the limit is test_heal_decisions.py's to prove; here a heal of what an earlier test
    # left broken must not use up the heals these are about.
    with reconcile_service(project, STACK, tmp_path_factory.mktemp("frozen-heals"),
                           max_heals=10) as files:
        yield files


class TestFrozenRank:
    """The frozen-rank heal, on one reconcile service (`frozen_service`, stopped after the
    class: the next test starts a service of its own)."""

    # SIGSTOP of rank 1: every container running, rank 0 alive: an NCCL stall's signature. A
    # `docker pause` of rank 0 (docker's state gives it away) walked no other path of the heal
    # and cost the 8-node session three minutes: reconcile's judgement of a paused container is
    # test_heal_policy.py's, and test_heal_decisions.py stops a rank 0 whose heal is refused.
    def test_watch_replaces_a_group_with_a_stopped_rank_1_under_load(
            self, stack: auto.Stack, sim: SimCluster, frozen_service: dict) -> None:
        """decode-b's rank 1 SIGSTOPped: docker says running. The group hangs (the stand-in
        stalls as SGLang's collectives do: rank 0's /health goes unanswered or 503), refresh sees
        no drift, and reconcile replaces exactly decode-b's containers by name (`up
        --replace`), with no person."""
        log = frozen_service["log.jsonl"]
        started = len(decisions(log))
        wait_until(lambda: [d for d in decisions(log, started) if d.get("decision") == "healthy"],
                   120, "a healthy pass")
        # What this test judges: what the service logs once every unit served (not a heal of
        # something an earlier test left broken).
        since = len(decisions(log))
        before = container_ids(sim)
        node, container = DECODE["decode-b"][1], "kimipd-decode-b-r1"
        run = heal_under_load(sim, log, "decode-b", f"http://{DECODE['decode-b'][0]}:30000",
                              ROUTER, lambda: stop_server(sim, node, container), since)
        lines = decisions(log, since)
        healed = [d for d in lines if d.get("decision") == "healed"]
        failed = run.failed_since_broken()
        back = run.back_at - run.broken_at
        print(f"SIGSTOP of decode-b rank 1: serving whole again after {back:.1f}s; "
              f"{len(run.results)} requests, {len(failed)} failed {failed}; "
              f"heal {healed[0]['seconds'] if healed else '-'}s, replaced "
              f"{healed[0].get('replace') if healed else '-'}")
        assert [d["units"] for d in healed] == [["decode-b"]], lines
        assert sorted(healed[0]["replace"]) == [f"node-{address.replace('.', '-')}-decode"
                                                for address in DECODE["decode-b"]], healed[0]
        assert not [d for d in lines if d.get("decision") == "healed" and not d.get("replace")]
        after = container_ids(sim)
        for name, state in before.items():
            if not name.startswith("kimipd-decode-b-"):
                assert after.get(name) == state, f"{name} changed when only decode-b was replaced"
        # Only requests the slots sent to decode-b before they stopped choosing it fail (each waits
        # out the client's 10 s): none sent once it serves again.
        assert len(run.results) > 20
        assert all(sent < back for sent, _ in failed), failed
        # The hang is seen after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) or the probe's timeout, the
        # grace is 4 s, the drain of a hung group ends once its rank 0's /health has failed for
        # a while, then one group load (3 s) and the admission: 240 s is room for a busy machine.
        assert back < 240, f"serving whole again only after {back:.0f}s"
