"""assets/router-members.py against the real sglang-router 0.3.2 (started through
assets/router-launch.py, key from a file) and stand-in servers, all on loopback: admission,
the rollout lease, a drain that lets an in-flight request finish, and a removal."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(300)

KEY = "unit-test-router-key"
MEMBERS = REPO / "assets" / "router-members.py"
STANDIN = REPO / "sim" / "standin"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds}s: {what}")


def answers(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


class Cluster:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.processes: list[subprocess.Popen] = []
        self.urls: dict[str, str] = {}
        self.state = work / "state"
        self.key_file = work / "api-key"
        self.key_file.write_text(KEY + "\n")
        self.router = ""
        self.bootstrap: dict[str, str] = {}
        self.by_name: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = (self.work / f"{name}.log").open("w")
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=env, cwd="/tmp"))
        self.by_name[name] = self.processes[-1]

    def server(self, name: str, mode: str, **env: str) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(self.work),
                "--host", "127.0.0.1", "--port", str(port), "--disaggregation-mode", mode]
        if mode == "prefill":
            self.bootstrap[name] = str(free_port())
            argv += ["--disaggregation-bootstrap-port", self.bootstrap[name]]
        self.start(name, argv, dict(os.environ, PYTHONPATH=str(STANDIN),
                                    SGLANG_STANDIN_LOAD_SECONDS="0", **env))
        self.urls[name] = f"http://127.0.0.1:{port}"

    def start_router(self, python: Path, port: int | None = None, name: str = "router",
                     check_port: int | None = None, extra: tuple[str, ...] = ()) -> str:
        """A real router on PORT (a free one unless said), with its pair check on CHECK_PORT
        if given and EXTRA router flags; the first one is self.router."""
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        self.router = self.router or url
        check = [] if check_port is None else ["--pair-check-port", str(check_port)]
        self.start(name, [str(python), str(REPO / "assets" / "router-launch.py"),
                              "--api-key-file", str(self.key_file), *check, "--",
                              "--pd-disaggregation",
                              "--policy", "round_robin", "--host", "127.0.0.1", "--port",
                              str(port), "--prometheus-port", str(free_port()), *extra],
                   dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9",
                        NO_PROXY="*"))
        wait_until(lambda: answers(url + "/health") == 200, 30, f"{name} up")
        return url

    def members(self, action: str, name: str = "", *extra: str,
                timeout: float = 20) -> subprocess.CompletedProcess:
        argv = [sys.executable, str(MEMBERS), action, "--router", self.router,
                "--api-key-file", str(self.key_file), "--state-dir", str(self.state),
                "--timeout", f"{timeout:g}", "--interval", "0.2", *extra]
        if name:
            mode = "prefill" if name.startswith("prefill") else "decode"
            argv += ["--group", name, "--mode", mode, "--url", self.urls[name]]
            if action in ("admit", "want") and mode == "prefill":
                argv += ["--bootstrap-port", self.bootstrap[name]]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    def healthy(self, router: str = "") -> set[str]:
        request = urllib.request.Request((router or self.router) + "/workers",
                                         headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            listing = json.load(response)
        by_url = {url: name for name, url in self.urls.items()}
        return {by_url[w["url"]] for w in listing["workers"] if w["is_healthy"]}

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            ended(process)

    def stop_one(self, name: str) -> None:
        self.by_name[name].terminate()
        ended(self.by_name[name])


def ended(process: subprocess.Popen) -> None:
    """Waits for a terminated PROCESS (smg's SIGTERM keeps its listener 5 s), killed past 15 s."""
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    real = os.environ.get("KIMIPD_REAL_SGLANG_VENV")
    assert real, "KIMIPD_REAL_SGLANG_VENV is unset: scripts/test makes the real router's venv"
    cluster = Cluster(tmp_path_factory.mktemp("router-members"))
    try:
        cluster.server("prefill-a", "prefill")
        cluster.server("decode-a", "decode", SGLANG_STANDIN_DECODE_TOKENS_PER_S="4")
        cluster.server("decode-b", "decode")
        for url in cluster.urls.values():
            wait_until(lambda url=url: answers(url + "/health") == 200, 30, f"{url} healthy")
        cluster.start_router(Path(real) / "bin" / "python")
        yield cluster
    finally:
        cluster.stop()


def test_the_key_stays_off_the_command_line_and_guards_the_worker_api(cluster: Cluster) -> None:
    assert answers(cluster.router + "/workers") == 401
    assert answers(cluster.router + "/workers", {"Authorization": f"Bearer {KEY}"}) == 200
    router = cluster.processes[-1]
    assert KEY.encode() not in Path(f"/proc/{router.pid}/cmdline").read_bytes()


def test_admission_registers_each_group_and_the_router_becomes_ready(cluster: Cluster) -> None:
    for name in cluster.urls:
        assert cluster.members("want", name).returncode == 0
        admitted = cluster.members("admit", name)
        assert admitted.returncode == 0, admitted.stderr
        assert f"{name}: admitted, healthy in the router" in admitted.stdout
    ready = cluster.members("ready", "", *[arg for url in cluster.urls.values()
                                           for arg in ("--expect", url)])
    assert ready.returncode == 0, ready.stderr
    assert cluster.healthy() == set(cluster.urls)


def test_admission_waits_for_a_slot_that_answers_late(cluster: Cluster) -> None:
    """The other slot, replaced while decode-b was out (its restore skipped decode-b), answers
    only 3 s into the admission: decode-b is registered there too, not left out for good."""
    port = free_port()
    late = f"http://127.0.0.1:{port}"
    python = Path(os.environ["KIMIPD_REAL_SGLANG_VENV"]) / "bin" / "python"
    starter = threading.Timer(3.0, cluster.start_router, args=(python, port, "router-late"))
    starter.start()
    try:
        admitted = cluster.members("admit", "decode-b", "--router", late, timeout=60)
        assert admitted.returncode == 0, admitted.stderr
        assert "does not answer: waiting up to 30s" in admitted.stdout, admitted.stdout
        assert "decode-b: admitted, healthy in 2 routers" in admitted.stdout, admitted.stdout
        assert "decode-b" in cluster.healthy(late)
    finally:
        starter.join(60)  # the router's start waits for its /health at most 30 s
        cluster.stop_one("router-late")


def test_admission_goes_on_without_a_slot_silent_past_the_grace(cluster: Cluster) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    admitted = cluster.members("admit", "decode-b", "--router", dead, "--silent-grace", "1",
                               timeout=110)
    took = time.monotonic() - started
    assert admitted.returncode == 0, admitted.stderr
    assert f"{dead} has not answered for 1s: admitted without it" in admitted.stdout
    # The 1 s grace and the script's start: ~2 s. Without the grace it would wait 55 s (half the
    # timeout) or until the timeout.
    assert 1.0 <= took < 20, took
    assert "decode-b" in cluster.healthy()


def test_the_lease_lets_one_group_of_a_mode_out_at_a_time(cluster: Cluster) -> None:
    drained = cluster.members("drain", "decode-a", "--drain-timeout", "5")
    assert drained.returncode == 0, drained.stderr
    assert "lease taken" in drained.stdout and cluster.healthy() == {"prefill-a", "decode-b"}
    refused = cluster.members("drain", "decode-b", "--drain-timeout", "5", timeout=2)
    assert refused.returncode == 1
    assert "decode-a holds the decode rollout lease" in refused.stderr
    assert "decode-b keeps running and serving" in refused.stderr
    assert cluster.healthy() == {"prefill-a", "decode-b"}, "decode-b was drained anyway"
    readmitted = cluster.members("admit", "decode-a")
    assert "decode rollout lease given back" in readmitted.stdout, readmitted.stdout
    assert cluster.members("drain", "decode-b", "--drain-timeout", "5").returncode == 0
    assert cluster.healthy() == {"prefill-a", "decode-a"}
    assert cluster.members("admit", "decode-b").returncode == 0


def running_requests(url: str) -> int:
    """The stand-in's own count of the requests it runs (SGLang's /get_load)."""
    with urllib.request.urlopen(url + "/get_load", timeout=5) as response:
        loads = json.load(response)
    return sum(load["num_reqs"] + load["num_waiting_reqs"]
               for load in (loads if isinstance(loads, list) else [loads]))


def test_a_drain_waits_for_the_request_in_flight(cluster: Cluster) -> None:
    """decode-a generates 4 tokens/s: a 64-token request is in flight there for about 16 s, far
    longer than decode-b's admission before the drain (~1 s; 8.4 s once beside the set-up's
    builds, longer than the 32-token request this test sent before)."""
    outcome: dict[str, float] = {}

    def slow_request() -> None:
        body = json.dumps({"text": "slow", "sampling_params": {"max_new_tokens": 64}}).encode()
        request = urllib.request.Request(cluster.router + "/generate", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        outcome["sent"] = time.monotonic()
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            outcome["status"] = response.status
        outcome["answered"] = time.monotonic()

    # decode-b out, so the request surely goes to decode-a; then decode-a drained under it.
    assert cluster.members("drain", "decode-b", "--drain-timeout", "5").returncode == 0
    client = threading.Thread(target=slow_request, daemon=True)
    client.start()
    wait_until(lambda: running_requests(cluster.urls["decode-a"]) == 1, 30,
               "the request running on decode-a")
    cluster.members("admit", "decode-b")
    started = time.monotonic()
    drained = cluster.members("drain", "decode-a", "--drain-timeout", "30")
    returned = time.monotonic()
    client.join(60)
    assert drained.returncode == 0, drained.stderr
    assert outcome.get("status") == 200, "the request in flight on the drained group failed"
    assert "no requests running" in drained.stdout, drained.stdout
    # The drain began with the request in flight, and returned no earlier than its last token
    # was due (63 tokens after the first, at 4 tokens/s): it waited for it.
    assert started < outcome["answered"], (started, outcome)
    assert returned - outcome["sent"] >= 63 / 4, (outcome, returned)
    assert cluster.members("admit", "decode-a").returncode == 0


def test_a_group_leaving_the_config_goes_without_waiting_for_a_peer(cluster: Cluster) -> None:
    assert cluster.members("drain", "decode-a", "--drain-timeout", "5").returncode == 0
    # decode-a holds the lease (drained for a replacement); decode-b leaves the config instead.
    assert cluster.members("unwant", "decode-b").returncode == 0
    gone = cluster.members("drain", "decode-b", "--drain-timeout", "5", timeout=2)
    assert gone.returncode == 0, gone.stderr
    assert "leaving the config" in gone.stdout
    assert cluster.healthy() == {"prefill-a"}


def test_restore_gives_a_new_router_every_group_not_out_for_its_replacement(
        cluster: Cluster) -> None:
    """What a replaced router gets at once: decode-a holds the lease (drained above, out for its
    replacement) and stays out; decode-b, wanted again, and prefill-a are registered."""
    assert cluster.members("want", "decode-b").returncode == 0
    restored = cluster.members("restore")
    assert restored.returncode == 0, restored.stderr
    assert "decode-a: out for its replacement" in restored.stdout
    wait_until(lambda: cluster.healthy() == {"prefill-a", "decode-b"}, 20,
               "decode-b registered by restore, decode-a left out")
    assert cluster.members("admit", "decode-a").returncode == 0


def test_every_group_of_a_mode_dead_is_drained_without_waiting_for_a_peer(
        cluster: Cluster) -> None:
    """Two more decode groups, admitted, then both killed: neither drain waits for the other
    (before, each waited for a healthy peer that the other's drain never let come back)."""
    for name in ("decode-c", "decode-d"):
        cluster.server(name, "decode")
        wait_until(lambda name=name: answers(cluster.urls[name] + "/health") == 200, 30,
                   f"{name} healthy")
        assert cluster.members("want", name).returncode == 0
        assert cluster.members("admit", name).returncode == 0
    # The others out of the router: decode-c and decode-d are the only decode groups serving.
    for name in ("decode-a", "decode-b"):
        assert cluster.members("unwant", name).returncode == 0
        assert cluster.members("drain", name, "--drain-timeout", "5").returncode == 0
    alive = cluster.members("drain", "decode-c", "--drain-timeout", "5", timeout=2)
    assert alive.returncode == 0 and "lease taken; " in alive.stdout, alive.stdout
    assert cluster.members("admit", "decode-c").returncode == 0
    for name in ("decode-c", "decode-d"):
        process = cluster.by_name[name]
        process.kill()
        process.wait(10)
    started = time.monotonic()
    for name in ("decode-c", "decode-d"):
        drained = cluster.members("drain", name, "--drain-timeout", "5", timeout=50)
        assert drained.returncode == 0, drained.stderr
        assert "its rank 0 is not running" in drained.stdout, drained.stdout
    # Two script starts, ~1 s each; a drain that waited for a peer would wait out its 50 s.
    took = time.monotonic() - started
    assert took < 20, f"a dead group's drain waited for a peer ({took:.1f}s)"
    assert "decode-c" not in cluster.healthy() and "decode-d" not in cluster.healthy()
    # A live group whose only peer is dead still waits: the rollout keeps one serving.
    for name in ("decode-a", "decode-b"):
        assert cluster.members("want", name).returncode == 0
    assert cluster.members("admit", "decode-a").returncode == 0
    for name in ("decode-c", "decode-d"):
        assert cluster.members("unwant", name).returncode == 0
    waited = cluster.members("drain", "decode-a", "--drain-timeout", "5", timeout=2)
    assert waited.returncode == 1 and "no other decode group" in waited.stderr, waited.stderr
    assert "decode-a" in cluster.healthy()


def test_without_the_door_a_new_contract_empties_the_router_of_the_old_one(
        cluster: Cluster) -> None:
    """One router, no door: the first group admitted under a new serving contract takes the
    router whole (an outage, never a mix); the old contract's groups join only under the new
    one, and one left registered nowhere drains without a peer."""
    for name in ("prefill-a", "decode-a", "decode-b"):
        assert cluster.members("want", name).returncode == 0
        admitted = cluster.members("admit", name, "--contract", "c0")
        assert admitted.returncode == 0, admitted.stderr
    assert cluster.healthy() == {"prefill-a", "decode-a", "decode-b"}
    renewed = cluster.members("admit", "decode-b", "--contract", "c1")
    assert renewed.returncode == 0, renewed.stderr
    # The contract as admitted: the config's, then what the group's /server_info resolved.
    assert re.search(r"it serves contract c1\.[0-9a-f]{8} from now on", renewed.stdout), \
        renewed.stdout
    assert cluster.healthy() == {"decode-b"}
    assert cluster.members("admit", "prefill-a", "--contract", "c1").returncode == 0
    assert cluster.healthy() == {"prefill-a", "decode-b"}
    drained = cluster.members("drain", "decode-a", "--drain-timeout", "5", timeout=5)
    assert drained.returncode == 0, drained.stderr
    assert cluster.healthy() == {"prefill-a", "decode-b"}


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {KEY}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_the_router_itself_refuses_a_prefill_and_a_decode_of_two_contracts(
        cluster: Cluster) -> None:
    """The second line behind the record: registrations carry their group's contract as smg's
    pairing protocol. A prefill of one and a decode of another (as an actor that bypassed the
    record would leave them) get no request: smg answers 503 no_compatible_pd_pair and the slot's
    pair check, what the door asks, is 503 though smg's own /readiness is 200."""
    python = Path(os.environ["KIMIPD_REAL_SGLANG_VENV"]) / "bin" / "python"
    port, check_port = free_port(), free_port()
    router = cluster.start_router(python, port, "router-paired", check_port=check_port)
    sys.path.insert(0, str(REPO / "assets"))
    try:
        from router_api import Router, register  # the scripts' own registration
        slot = Router(router, str(cluster.key_file))
        register(slot, "prefill-a", cluster.urls["prefill-a"], "prefill",
                 int(cluster.bootstrap["prefill-a"]), "contract-x")
        register(slot, "decode-a", cluster.urls["decode-a"], "decode", None, "contract-y")
        wait_until(lambda: cluster.healthy(router) == {"prefill-a", "decode-a"}, 30,
                   "both registered and healthy")
        listed = {w["url"]: w["pairing_protocol"] for w in slot.workers() or []}
        assert listed == {cluster.urls["prefill-a"]: "contract-x",
                          cluster.urls["decode-a"]: "contract-y"}
        assert answers(router + "/readiness") == 200  # smg's own check ignores pairing
        assert answers(f"http://127.0.0.1:{check_port}/pairs") == 503
        status, body = post(router + "/generate", {"text": "hello",
                                                   "sampling_params": {"max_new_tokens": 2}})
        assert status == 503, body
        assert body["error"]["code"] == "no_compatible_pd_pair", body
        # A decode of the prefill's contract: paired, and the pair check lets the door send.
        register(slot, "decode-b", cluster.urls["decode-b"], "decode", None, "contract-x")
        wait_until(lambda: answers(f"http://127.0.0.1:{check_port}/pairs") == 200, 30,
                   "the pair check sees contract-x whole")
        for _ in range(4):
            status, body = post(router + "/generate", {"text": "hello",
                                                       "sampling_params": {"max_new_tokens": 2}})
            assert status == 200, body
            assert not body["meta_info"].get("kv_contract_mismatch"), body
        # The group replaced in place by another contract: its registration is renewed.
        register(slot, "decode-a", cluster.urls["decode-a"], "decode", None, "contract-x")
        wait_until(lambda: {w["url"]: w["pairing_protocol"] for w in slot.workers() or []}
                   .get(cluster.urls["decode-a"]) == "contract-x", 30,
                   "decode-a registered again as contract-x")
    finally:
        sys.path.remove(str(REPO / "assets"))
        cluster.stop_one("router-paired")


def rendered_flags(*names: str) -> tuple[str, ...]:
    """NAMES with their values as the program renders the sim stack's router."""
    from components.config import load_cluster_config
    from components.render import router_command
    from tests.conftest import stack_values
    argv = router_command(load_cluster_config(stack_values("sim-2p2d")))
    return tuple(item for name in names for item in (name, argv[argv.index(name) + 1]))


def generate_until(url: str, stop: threading.Event, answers_seen: list) -> None:
    """One small /generate after another until STOP: (sent, status, error code) each."""
    while not stop.is_set():
        sent = time.monotonic()
        status, body = post(url + "/generate", {"text": "hi",
                                                "sampling_params": {"max_new_tokens": 2}})
        answers_seen.append((sent, status, (body.get("error") or {}).get("code", "")))
        time.sleep(0.05)


def test_a_decode_mode_dead_then_back_serves_as_soon_as_it_is_registered_again(
        tmp_path: Path) -> None:
    """Every decode dead opens every prefill's circuit (smg counts a pair's failure against its
    prefill too). With the program's circuit timeout the router serves again once the healed
    decode is registered again; at smg's 60 s it went on refusing for half a minute after."""
    python = Path(os.environ["KIMIPD_REAL_SGLANG_VENV"]) / "bin" / "python"
    cluster = Cluster(tmp_path)
    stop, seen = threading.Event(), []
    load: threading.Thread | None = None
    try:
        cluster.server("prefill-a", "prefill")
        cluster.server("decode-a", "decode")
        for url in cluster.urls.values():
            wait_until(lambda url=url: answers(url + "/health") == 200, 30, f"{url} healthy")
        router = cluster.start_router(python, extra=rendered_flags(
            "--health-check-interval-secs", "--health-failure-threshold",
            "--cb-timeout-duration-secs", "--retry-max-retries"))
        for name in ("prefill-a", "decode-a"):
            assert cluster.members("admit", name).returncode == 0
        load = threading.Thread(target=generate_until, args=(router, stop, seen))
        load.start()
        time.sleep(2)
        decode_port = cluster.urls["decode-a"].rsplit(":", 1)[1]
        cluster.stop_one("decode-a")
        died = time.monotonic()
        wait_until(lambda: any(status == 503 for sent, status, _ in seen if sent > died), 20,
                   "the router refusing")
        time.sleep(12)  # dead past the circuit's timeout: it re-opens on its trial request
        assert cluster.members("drain", "decode-a").returncode == 0
        cluster.start("decode-a-again", [
            sys.executable, "-m", "sglang.launch_server", "--model-path", str(tmp_path),
            "--host", "127.0.0.1", "--port", decode_port, "--disaggregation-mode", "decode"],
            dict(os.environ, PYTHONPATH=str(STANDIN), SGLANG_STANDIN_LOAD_SECONDS="0"))
        wait_until(lambda: answers(cluster.urls["decode-a"] + "/health") == 200, 30,
                   "decode-a back")
        assert cluster.members("admit", "decode-a").returncode == 0
        registered = time.monotonic()
        time.sleep(8)
    finally:
        stop.set()
        if load is not None:
            load.join(20)
        cluster.stop()
    refused = [(round(sent - died, 1), status, code) for sent, status, code in seen
               if sent > died and status != 200]
    assert ("no_available_workers" in {code for _, _, code in refused}), refused[:5]
    late = [answer for answer in refused if answer[0] > registered - died + 1]
    assert not late, (f"refused after decode-a was registered again at "
                      f"{registered - died:.1f}s: {late[:5]}")
    assert sum(1 for sent, status, _ in seen if sent > registered + 1 and status == 200) >= 20
