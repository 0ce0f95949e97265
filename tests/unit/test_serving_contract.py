"""The serving contract: its digest from the typed config (render/contract.py), the decode groups'
halves (components/cluster.paired_prefill), and the router's node keeping one contract per router
(assets/router-members.py, router_api.py) through a rollout of a new one, against routers and a
door that keep their state in memory: no router ever holds a prefill and a decode of two
contracts, and with the door and two groups of each mode a slot serves at every step."""

from __future__ import annotations

import argparse
import copy
import itertools
from typing import Any

import pytest

from components.cluster import paired_prefill
from components.config import ConfigError, load_cluster_config
from components.render import (
    contract_digest,
    model_fingerprint,
    running_contract,
    serving_contract,
    wait_healthy_command,
)
from components.render.sglang import sglang_rank_plan
from tests.conftest import asset_script, stack_values

DIGESTS = {"/tmp/patch_k3_sm120.py": "a" * 64}


def digest(values: dict, node_files: dict[str, str] = DIGESTS) -> str:
    return contract_digest(serving_contract(load_cluster_config(values), node_files))


def changed(values: dict, edit) -> dict:
    values = copy.deepcopy(values)
    edit(values)
    return values


def extra(group: str, *args: str):
    def edit(values: dict) -> None:
        values["groups"][group]["extraArgs"] = [*values["groups"][group].get("extraArgs", []),
                                                *args]
    return edit


def both(*args: str):
    def edit(values: dict) -> None:
        for group in values["groups"].values():
            group["extraArgs"] = [*group.get("extraArgs", []), *args]
    return edit


@pytest.fixture
def values() -> dict:
    return stack_values("sim-2p2d")


@pytest.mark.parametrize("what, edit", [
    ("a new checkpoint", lambda v: v["model"].update(path="/data/models/Kimi-K3-0912")),
    ("another served name", lambda v: v["model"].update(servedModelName="kimi-k3-new")),
    ("another image", lambda v: v.update(image="lmsysorg/sglang:kimi-k3-next")),
    ("an fp8 KV cache on every group", both("--kv-cache-dtype", "fp8_e4m3")),
    ("another page size on every group", both("--page-size", "64")),
    ("a backend on every group that snaps the page size", both("--attention-backend",
                                                               "flashmla")),
])
def test_what_both_modes_share_changes_the_contract(values: dict, what: str, edit) -> None:
    assert digest(changed(values, edit)) != digest(values), what


def test_a_node_file_changes_the_contract(values: dict) -> None:
    assert digest(values, {"/tmp/patch_k3_sm120.py": "b" * 64}) != digest(values)


@pytest.mark.parametrize("what, edit", [
    ("a decode-only flag", extra("decode-b", "--max-running-requests", "64")),
    ("a group's restart", lambda v: v["groups"]["decode-a"].update(restartGeneration=3)),
    ("the stack's restart", lambda v: v.update(restartGeneration=2)),
    ("the same KV dtype written out", both("--kv-cache-dtype", "auto")),
])
def test_what_one_side_may_change_alone_keeps_the_contract(values: dict, what: str,
                                                           edit) -> None:
    assert digest(changed(values, edit)) == digest(values), what


def test_a_decode_only_backend_that_snaps_the_page_size_is_refused(values: dict) -> None:
    """SGLang 0.5.19 snaps --page-size by attention backend (flashmla: 64): a decode-only
    backend change gives decode other pages with the same image and flags."""
    with pytest.raises(ConfigError) as refused:
        load_cluster_config(changed(values, extra("decode-a", "--decode-attention-backend",
                                                  "flashmla")))
    assert ("--page-size is not set (SGLang's default) on prefill-a and '64' "
            "(groups.decode-a.extraArgs: --decode-attention-backend flashmla snaps it) on "
            "decode-a") in str(refused.value)
    # The size it snaps to, given to every group, agrees (and is the contract's).
    agreed = changed(changed(values, both("--page-size", "64")),
                     extra("decode-a", "--decode-attention-backend", "flashmla"))
    assert digest(agreed) == digest(changed(values, both("--page-size", "64")))


def test_a_decode_context_longer_than_prefills_keeps_the_contract(values: dict) -> None:
    base = changed(values, both("--context-length", "131072"))
    assert digest(changed(base, extra("decode-a", "--context-length", "262144"))) == digest(base)


@pytest.mark.parametrize("prefill, decode, expected", [
    (["p0", "p1"], ["d0", "d1"], {"d0": ["p0"], "d1": ["p1"]}),
    (["p0"], ["d0", "d1"], {"d0": ["p0"], "d1": ["p0"]}),
    (["p0", "p1", "p2"], ["d0", "d1"], {"d0": ["p0", "p2"], "d1": ["p1"]}),
    (["p0", "p1"], ["d0", "d1", "d2"], {"d0": ["p0"], "d1": ["p1"], "d2": ["p0"]}),
    (["p0"], ["d0"], {"d0": ["p0"]}),
])
def test_each_decode_waits_for_its_half_of_the_prefill_groups(
        prefill: list[str], decode: list[str], expected: dict[str, list[str]]) -> None:
    pairs = paired_prefill(prefill, decode)
    assert pairs == expected
    # Every prefill is waited for by some decode, every decode waits for at least one.
    assert {p for partners in pairs.values() for p in partners} == set(prefill)


def test_an_empty_router_takes_one_whole_contract() -> None:
    api = asset_script("router_api.py")
    modes = {"p1": "prefill", "p2": "prefill", "d1": "decode", "d2": "decode"}
    assert api.one_contract(modes, {g: "c0" for g in modes}, "c0") == "c0"
    # Groups admitted before contracts were recorded run one of their own.
    unrecorded = {g: api.UNRECORDED for g in modes}
    assert api.one_contract(modes, unrecorded, None) == api.UNRECORDED
    # The new contract has a prefill only: the old one, which still has both modes, serves.
    halfway = {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c0"}
    assert api.one_contract(modes, halfway, "c1") == "c0"
    # The new one has both modes: it is the one.
    paired = {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c1"}
    assert api.one_contract(modes, paired, "c1") == "c1"
    # The first change after an upgrade: the unrecorded groups are not the new contract's.
    upgraded = {"p1": api.UNRECORDED, "p2": "c1", "d1": api.UNRECORDED, "d2": api.UNRECORDED}
    assert api.one_contract(modes, upgraded, "c1") == api.UNRECORDED


@pytest.mark.parametrize("held, converting, recorded, contracts, expected", [
    # A slot out at the door to take c1 takes c1 only, whatever else it is told.
    (set(), "c1", "c0", {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c0"}, "c1"),
    ({"c1"}, "c1", "c1", {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c0"}, "c1"),
    # It holds c1's prefill only: c1 still, never completed with c0's groups (issue 50).
    ({"c1"}, None, "c1", {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c0"}, "c1"),
    # Found holding two: its recorded one stays, the other is removed.
    ({"c0", "c1"}, None, "c0", {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c0"}, "c0"),
    # Empty (a new router): its recorded contract while that is whole, else the whole one.
    (set(), None, "c0", {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c1"}, "c0"),
    (set(), None, "c0", {"p1": "c1", "p2": "c1", "d1": "c0", "d2": "c1"}, "c1"),
    (set(), None, None, {"p1": "c0", "p2": "c1", "d1": "c0", "d2": "c0"}, "c0"),
])
def test_a_slot_serves_one_contract(held: set[str], converting: str | None,
                                    recorded: str | None, contracts: dict[str, str],
                                    expected: str) -> None:
    api = asset_script("router_api.py")
    modes = {"p1": "prefill", "p2": "prefill", "d1": "decode", "d2": "decode"}
    assert api.slot_serves(held, converting, recorded, modes, contracts, "c1") == expected


# --- the rollout, against routers and a door that keep their state in memory ---------------

class MemoryRouter:
    """The worker API router-members.py uses, as smg answers it: POST (its pairing protocol
    kept; 409 for a URL registered already), GET and DELETE /workers; every worker is healthy
    at once, and a removed one is gone at once."""

    def __init__(self, url: str, slot: str | None) -> None:
        self.url, self.slot, self.key = url, slot, "k"
        self.registrations: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count()

    def workers(self) -> list[dict[str, Any]]:
        return [dict(w) for w in self.registrations.values()]

    listed = workers

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        if method == "POST":
            assert body is not None
            if any(w["url"] == body["url"] for w in self.registrations.values()):
                return 409, {"code": "WORKER_ALREADY_EXISTS"}
            worker_id = f"w{next(self.ids)}"
            self.registrations[worker_id] = {"id": worker_id, "url": body["url"],
                                             "worker_type": body["worker_type"],
                                             "pairing_protocol": body.get("pairing_protocol"),
                                             "is_healthy": True}
            return 202, None
        if method == "DELETE":
            self.registrations.pop(path.rsplit("/", 1)[1], None)
            return 202, None
        raise AssertionError(f"{method} {path}")

    def modes(self) -> set[str]:
        return {w["worker_type"] for w in self.registrations.values() if w["is_healthy"]}

    def urls(self) -> set[str]:
        return {w["url"] for w in self.registrations.values()}


class MemoryDoor:
    """router.node's door: a slot set to drain takes nothing new; one set ready is UP while its
    router has a healthy prefill and decode (its /readiness), DOWN otherwise."""

    def __init__(self, routers: list[MemoryRouter]) -> None:
        self.routers = {router.slot: router for router in routers}
        self.admin = {slot: "ready" for slot in self.routers}

    def servers(self) -> dict[str, dict[str, str]]:
        rows = {}
        for slot, router in self.routers.items():
            if self.admin[slot] == "drain":
                status = "DRAIN"
            else:
                status = "UP" if router.modes() >= {"prefill", "decode"} else "DOWN"
            rows[slot] = {"status": status, "scur": "0", "qcur": "0"}
        return rows

    def set_state(self, server: str, state: str) -> None:
        self.admin[server] = state


GROUPS = {"prefill-a": "prefill", "prefill-b": "prefill", "decode-a": "decode",
          "decode-b": "decode"}


class Node:
    """router.node: its state directory, the routers (slots) and the door; each action of
    router-members.py as the commands run it."""

    def __init__(self, tmp_path, monkeypatch: pytest.MonkeyPatch, slots: list[str | None],
                 groups: dict[str, str]) -> None:
        self.members = asset_script("router-members.py")
        self.groups = groups
        # What each group's /server_info resolves to (URL -> its digest; "r0" by default).
        self.resolved: dict[str, str] = {}
        self.urls = {group: f"http://10.9.9.{i}:30000" for i, group in enumerate(groups, 1)}
        self.routers = [MemoryRouter(f"http://127.0.0.1:{31001 + i}", slot)
                        for i, slot in enumerate(slots)]
        self.door = (MemoryDoor(self.routers) if all(slot is not None for slot in slots)
                     else None)
        self.state = self.members.State(str(tmp_path / "state"))
        # The groups' own servers answer, run nothing and are healthy.
        for name, value in (("rank0_refuses", lambda url: False),
                            ("rank0_answers", lambda url: True),
                            ("rank0_healthy", lambda url, key: True),
                            ("running_requests", lambda url, key: 0),
                            ("runtime_contract", lambda url, key: self.resolved.get(url, "r0"))):
            monkeypatch.setattr(self.members, name, value)
        monkeypatch.setattr(self.members, "Door", lambda path: self.door)
        self.contract: dict[str, str] = {}

    def args(self, group: str, **more: Any) -> argparse.Namespace:
        return argparse.Namespace(
            group=group, mode=self.groups[group], url=self.urls[group], bootstrap_port=None,
            rollout="one-group-at-a-time", drain_timeout=1, timeout=more.pop("timeout", 5),
            interval=0.01, silent_grace=0.05,
            door_socket="/door.sock" if self.door is not None else None, **more)

    def want_all(self, contract: str) -> None:
        """Every group wanted and admitted under CONTRACT."""
        for group, mode in self.groups.items():
            self.state.mark(self.state.marker(group), f"{mode} {self.urls[group]} -")
        for group in self.groups:
            self.admit(group, contract)

    def admit(self, group: str, contract: str) -> None:
        self.members.admit(self.args(group, contract=contract), self.routers, self.state)
        self.contract[group] = contract
        self.check()

    def drain(self, group: str, timeout: float = 5) -> None:
        self.members.drain(self.args(group, timeout=timeout), self.routers, self.state)
        self.check()

    def holds(self) -> list[dict[str, str]]:
        """Each router's registrations: group -> its contract."""
        by_url = {url: group for group, url in self.urls.items()}
        return [{by_url[url]: self.contract.get(by_url[url], "?") for url in router.urls()}
                for router in self.routers]

    def serving(self) -> list[str]:
        """The slots the door sends to (every router without the door) that have both modes."""
        rows = self.door.servers() if self.door is not None else {}
        return [router.slot or router.url for router in self.routers
                if router.modes() >= {"prefill", "decode"}
                and (self.door is None or rows[router.slot]["status"] == "UP")]

    def check(self) -> None:
        for router, held in zip(self.routers, self.holds(), strict=True):
            assert len(set(held.values())) <= 1, f"{router.slot or router.url} mixes: {held}"


def test_a_new_contract_rolls_in_halves_behind_the_door_and_never_mixes(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.want_all("c0")
    assert node.serving() == ["slot-a", "slot-b"]

    # The DAG's order: prefill-b first (the prefill lease), then its half's decode.
    node.drain("prefill-b")
    node.admit("prefill-b", "c1")
    # One slot took the new contract, out at the door; the other serves the old one.
    assert node.holds() == [{"prefill-b": "c1"},
                            {"prefill-a": "c0", "decode-a": "c0", "decode-b": "c0"}]
    assert node.serving() == ["slot-b"]
    # prefill-a is slot b's only prefill: it waits (and its wait times out here).
    with pytest.raises(SystemExit, match="no other prefill group is registered and healthy"):
        node.drain("prefill-a", timeout=0.2)
    node.drain("decode-b")
    assert node.serving() == ["slot-b"]
    node.admit("decode-b", "c1")
    # Slot a, whole again, serves the new contract; slot b moved on to it.
    assert node.holds() == [{"prefill-b": "c1", "decode-b": "c1"}] * 2
    assert node.serving() == ["slot-a", "slot-b"]
    # The other half serves nothing now: it drains without waiting for a peer.
    node.drain("prefill-a")
    node.admit("prefill-a", "c1")
    node.drain("decode-a")
    node.admit("decode-a", "c1")
    assert node.holds() == [{group: "c1" for group in GROUPS}] * 2
    assert node.serving() == ["slot-a", "slot-b"]
    assert not list((tmp_path / "state").glob("converting-*"))


def test_one_group_of_each_mode_is_an_outage_that_never_mixes(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    groups = {"prefill": "prefill", "decode": "decode"}
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], groups)
    node.want_all("c0")
    node.drain("prefill")
    assert node.serving() == []
    node.admit("prefill", "c1")
    assert node.holds() == [{"prefill": "c1"}] * 2
    node.drain("decode")
    node.admit("decode", "c1")
    assert node.holds() == [{"prefill": "c1", "decode": "c1"}] * 2
    assert node.serving() == ["slot-a", "slot-b"]


def test_without_the_door_the_router_takes_the_new_contract_at_once(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch, [None], GROUPS)
    node.want_all("c0")
    node.drain("prefill-b")
    node.admit("prefill-b", "c1")
    # One router: the old contract's groups leave it (an outage until a decode of the new one).
    assert node.holds() == [{"prefill-b": "c1"}]
    node.drain("decode-b")
    node.admit("decode-b", "c1")
    node.drain("prefill-a")
    node.admit("prefill-a", "c1")
    node.drain("decode-a")
    node.admit("decode-a", "c1")
    assert node.holds() == [{group: "c1" for group in GROUPS}]


def test_a_new_router_halfway_through_gets_the_contract_that_serves(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch, ["slot-a", "slot-b"], GROUPS)
    node.want_all("c0")
    node.drain("prefill-b")
    node.admit("prefill-b", "c1")
    fresh = MemoryRouter("http://127.0.0.1:31009", "slot-b")
    node.members.register_missing(fresh, node.state, quiet=True)
    # The new contract has no decode yet: the old one's groups, whole.
    by_url = {url: group for group, url in node.urls.items()}
    assert {by_url[url] for url in fresh.urls()} == {"prefill-a", "decode-a", "decode-b"}


def test_an_admission_declares_the_config_the_image_it_runs_and_the_checkpoint_it_loaded() -> None:
    image = "sha256:" + "ab" * 32
    assert running_contract("c0ffee", image) == "c0ffee-" + "ab" * 6
    assert running_contract("c0ffee", image, "0123456789ab") == f"c0ffee-{'ab' * 6}-0123456789ab"
    gate = "kimipd-decode-r0: healthy after 3s (http://x/health)\nmodel fingerprint: 0123456789ab\n"
    assert model_fingerprint(gate) == "0123456789ab"
    assert model_fingerprint("kimipd-decode-r0: healthy after 3s\nmodel fingerprint: unreadable\n") is None
    assert model_fingerprint("") is None


def test_a_groups_rank0_gate_reads_the_checkpoint_where_a_mount_puts_it_on_the_node() -> None:
    pro6000 = load_cluster_config(stack_values("pro6000"))
    rank0 = wait_healthy_command(pro6000, sglang_rank_plan(pro6000, "decode", 0), True)
    assert rank0.endswith("--fingerprint /data/models/Kimi-K3")
    assert "--fingerprint" not in wait_healthy_command(pro6000, sglang_rank_plan(pro6000, "decode", 1))
    # The sim's image carries the model: nothing on the node to read, the image id covers it.
    sim = load_cluster_config(stack_values("sim-2p2d"))
    assert "--fingerprint" not in wait_healthy_command(sim, sglang_rank_plan(sim, "decode-a", 0),
                                                       True)
