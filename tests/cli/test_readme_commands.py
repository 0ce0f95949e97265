"""The README's commands as an operator types them: the Pulumi CLI in the repository root on stack
`sim`, with the stack's own configuration (Pulumi.sim.yaml plus what scripts/setup-stack-sim sets
with `pulumi config set`), no inline program.

In file order, on one deployment: scripts/demo, then `pulumi preview --diff -s sim` (nothing to
change); the "Use" commands; what `pulumi preview --diff` shows for a decode-only edit; the review
summary (scripts/review) of real previews of a decode-only edit, an image change and `serving:
false`, the first through the commands of .github/workflows/preview.yml; refresh; destroy.
An edit is made in a copy of the repository (as a pull request's checkout would be), never in the
repository's own stack file. The backend is a directory of this test's own. Under another
KIMIPD_CACHE, setup-stack-sim points the stack file's sim paths (key, known_hosts, node files)
at that cache, where the sim that is up keeps them.

Needs the Python language host beside the CLI and the two resource plugins; skipped, naming the
missing file, where they are not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from review.changes import changes, order
from review.markdown import render
from sim.automation import (
    REPO, REQUIRED_PLUGINS, engine_env, installed_plugins, language_host_missing, sim_stack_env)
from sim.cache import follow_cache
from tests.integration.engine import NODES, container_ids
from tests.integration.sim import SimCluster, start_sim, stop_sim

pytestmark = pytest.mark.timeout(1800)

DECODE_RANKS = {f"decode-r{r}" for r in range(4)}
# Their containers' resource names: by node and mode (components/serving.py).
DECODE_CONTAINERS = {f"node-10-231-60-{5 + r}-decode": f"decode-r{r}" for r in range(4)}


@dataclass
class Cli:
    env: dict[str, str]
    sim: SimCluster
    state: Path
    work: Path  # copies of the repository (pull-request checkouts) and captured previews

    def run(self, line: str, cwd: Path = REPO, check: bool = True,
            extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """One shell line, as typed in the README, with the environment setup-stack-sim exports."""
        started = time.monotonic()
        result = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True,
                                env=os.environ | self.env | (extra or {}), timeout=1500, check=False)
        print(f"$ {line}  ({time.monotonic() - started:.0f}s, exit {result.returncode})")
        if check:
            assert result.returncode == 0, f"{line}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def checkout(self, name: str, **changes) -> Path:
        """A copy of the repository with `kimipd:KEY` values of Pulumi.sim.yaml changed."""
        copy = self.work / name
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__"))
        (copy / ".venv").symlink_to(os.readlink(REPO / ".venv"))
        if (REPO / "policy" / "venv").exists():  # the runner's kept venv (the workflow)
            (copy / "policy" / "venv").symlink_to(REPO / "policy" / "venv")
        path = copy / "Pulumi.sim.yaml"
        document = yaml.safe_load(path.read_text())
        for key, value in changes.items():
            document["config"][f"kimipd:{key}"] = value
        path.write_text(yaml.safe_dump(document))
        return copy


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> Iterator[Cli]:
    toolchain = engine_env()
    missing_file = language_host_missing(toolchain)
    if missing_file:
        pytest.skip(f"{missing_file} is missing: the CLI cannot run the program itself "
                    "(docs/air-gapped.md: the official CLI tarball carries it)")
    missing = REQUIRED_PLUGINS - installed_plugins(toolchain)
    if missing:
        pytest.skip("resource plugins not installed: " + ", ".join(
            f"{Path(toolchain['PULUMI_HOME']) / 'plugins' / f'resource-{n}-v{v}' / f'pulumi-resource-{n}'}"
            for n, v in sorted(missing)))
    sim = start_sim()
    sim.remove_kimipd_containers(NODES)
    state = tmp_path_factory.mktemp("state")
    try:
        yield Cli(env=sim_stack_env(state), sim=sim, state=state,
                  work=tmp_path_factory.mktemp("checkouts"))
    finally:
        sim.remove_kimipd_containers(NODES)
        stop_sim(sim)


def resources_line(output: str) -> str:
    return output[output.rindex("Resources:"):].strip()


def test_a_cli_preview_right_after_the_demo_changes_nothing(cli: Cli) -> None:
    started = time.monotonic()
    demo = subprocess.run([str(REPO / "scripts" / "demo")], capture_output=True, text=True,
                          env=os.environ | {"KIMIPD_SIM_STATE": str(cli.state)}, timeout=1500,
                          check=False)
    print(f"scripts/demo: {time.monotonic() - started:.0f}s")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "router:     http://10.231.60.5:31000" in demo.stdout
    assert ("door:       HAProxy on http://10.231.60.5:31000, slots a http://10.231.60.5:31001, "
            "b http://10.231.60.5:31002") in demo.stdout
    preview = cli.run("pulumi preview --diff -s sim")
    summary = resources_line(preview.stdout)
    assert re.fullmatch(r"Resources:\s+\d+ unchanged", summary), \
        f"a preview right after the demo plans changes:\n{preview.stdout[-4000:]}"


def test_git_sees_the_stack_file_without_the_set_up_values(cli: Cli) -> None:
    """The set-up's machine values are in the stack file; the git filter it registered hides
    them, so git shows at most other people's edits, and none when there are none."""
    text = (REPO / "Pulumi.sim.yaml").read_text()
    assert "secure: v1:" in text and "sim-node@sha256:" in text and "encryptionsalt:" in text
    assert "sim-door@sha256:" in text
    cleaned = cli.run("scripts/setup-stack-sim --git-clean < Pulumi.sim.yaml").stdout
    assert "secure:" not in cleaned and "encryptionsalt" not in cleaned
    assert "kimipd:image: 10.231.60.254:5000/kimipd/sim-node:latest\n" in cleaned
    assert "      image: 10.231.60.254:5000/kimipd/sim-door:latest\n" in cleaned
    # Under another KIMIPD_CACHE the set-up points the sim's paths at it; git sees the default's.
    assert "    knownHostsFile: ~/.cache/kimipd/sim/ssh/known_hosts\n" in cleaned
    assert cleaned.count("~/.cache/kimipd/sim/") == 5, cleaned
    git = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO,
                         capture_output=True, text=True, check=False)
    if git.returncode != 0:
        pytest.skip(f"{REPO} is not a git work tree")
    diff = cli.run("git diff -- Pulumi.sim.yaml").stdout
    assert not re.search(r"secure:|encryptionsalt|sim-(node|door)@sha256", diff), diff
    staged = cli.run("git show :Pulumi.sim.yaml").stdout
    if staged == cleaned:  # nobody else has an unstaged edit of the file
        assert cli.run("git status --porcelain -- Pulumi.sim.yaml").stdout == ""


def test_the_readme_use_commands(cli: Cli) -> None:
    # The stack dials the sim that is up, with its own key and known_hosts (KIMIPD_CACHE's).
    connection = yaml.safe_load((REPO / "Pulumi.sim.yaml").read_text())["config"]["kimipd:connection"]
    assert connection["knownHostsFile"] == follow_cache("~/.cache/kimipd/sim/ssh/known_hosts")
    assert Path(connection["knownHostsFile"]).expanduser().resolve() == \
        Path(cli.sim.env["KIMIPD_SIM_KNOWN_HOSTS"]).resolve()
    assert f"IdentityFile={follow_cache('~/.cache/kimipd/sim/ssh/id_ed25519')}" in connection["dockerSshOpts"]
    cli.run("pulumi stack select sim")
    cli.run('pulumi config set --secret sshPrivateKey -s sim < "$KIMIPD_SIM_KEY"',
            extra={"KIMIPD_SIM_KEY": cli.sim.env["KIMIPD_SIM_KEY"]})
    preview = cli.run("pulumi preview --diff -s sim")
    assert re.fullmatch(r"Resources:\s+\d+ unchanged", resources_line(preview.stdout)), preview.stdout[-3000:]
    up = cli.run("pulumi up --yes -s sim")
    assert re.search(r"Resources:\s+\d+ unchanged", up.stdout), up.stdout[-3000:]
    outputs = json.loads(cli.run("pulumi stack output --json -s sim").stdout)
    assert outputs["routerUrl"] == "http://10.231.60.5:31000"
    assert outputs["smokeTest"].strip()
    assert outputs["containers"]["decode-r2"]["node"] == "10.231.60.7"
    assert "PRIVATE KEY" not in json.dumps(outputs)


def test_preview_diff_of_a_decode_only_edit_shows_the_flag_on_the_decode_ranks_only(cli: Cli) -> None:
    groups = yaml.safe_load((REPO / "Pulumi.sim.yaml").read_text())["config"]["kimipd:groups"]
    args = groups["decode"]["extraArgs"]
    old = args[args.index("--max-running-requests") + 1]
    new = str(int(old) // 2)
    args[args.index("--max-running-requests") + 1] = new
    checkout = cli.checkout("decode-text", groups=groups)
    output = cli.run("pulumi preview --diff -s sim", cwd=checkout).stdout
    blocks = re.split(r"\n(?=    [-+~ ]{1,3}[\w:/]+: \()", output)
    changed = {}
    for block in blocks:
        head = re.match(r"    ([-+~ ]{1,3})([\w:/]+): \((\w[\w-]*)\)", block)
        urn = re.search(r"\[urn=\S+::([\w.-]+)\]", block)
        if head and urn and head.group(3) != "same":
            changed[urn.group(1)] = (head.group(2), head.group(3), block)
    replaced_containers = {name for name, (type_, op, _) in changed.items()
                           if type_ == "docker:index/container:Container"}
    assert replaced_containers == set(DECODE_CONTAINERS), \
        f"containers in the diff: {sorted(replaced_containers)}"
    assert {op for _, op, _ in changed.values()} == {"replace"}, \
        {name: op for name, (_, op, _) in changed.items()}
    # The rust router (stack sim): decode is drained before its ranks go and admitted after
    # its gate, and the router's readiness and the smoke test run again.
    assert set(changed) == set(DECODE_CONTAINERS) | {f"{r}-health" for r in DECODE_RANKS} | {
        "smoke-test-generate", "decode-drain", "decode-admit", "router-every-group-healthy"}
    for container, rank in DECODE_CONTAINERS.items():
        block = changed[container][2]
        assert re.search(rf'~ \[\d+\]: "{old}" => "{new}"', block), f"{rank}: the flag's change is not shown:\n{block}"
        assert "~ command" in block and "~ envs" not in block and "~ image" not in block, block
    assert re.fullmatch(r"Resources:\s+\+-12 to replace\s+\d+ unchanged", resources_line(output)), output[-2000:]


def workflow_preview_step() -> dict:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "preview.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["preview"]["steps"] if s.get("id") == "preview"]
    return step


def test_the_workflow_preview_step_posts_a_summary_of_a_decode_only_edit(cli: Cli) -> None:
    step = workflow_preview_step()
    groups = yaml.safe_load((REPO / "Pulumi.sim.yaml").read_text())["config"]["kimipd:groups"]
    args = groups["decode"]["extraArgs"]
    old = args[args.index("--max-running-requests") + 1]
    args[args.index("--max-running-requests") + 1] = str(int(old) // 2)
    checkout = cli.checkout("pull-request", groups=groups)
    step_summary = cli.work / "step-summary.md"
    cli.run(step["run"], cwd=checkout, extra={"STACK": "sim", "GITHUB_STEP_SUMMARY": str(step_summary)})
    summary = (checkout / "summary.md").read_text()
    assert step_summary.read_text() == summary
    for rank, node in zip(sorted(DECODE_RANKS), NODES[4:]):
        assert f"**{rank}** on {node} (`kimipd-{rank}`), replace:" in summary
    assert summary.count(f"| flag `--max-running-requests` | `{old}` | `{int(old) // 2}` |") == 4
    assert "prefill" not in summary and "mooncake-master" not in summary
    # The router slots and the door stay (stack sim): only the readiness check runs again,
    # after decode's drain and admission.
    assert "`kimipd-router-a`" not in summary and "`kimipd-router-b`" not in summary
    assert "`kimipd-door`" not in summary
    assert "command `router-every-group-healthy` | replace |" in summary
    # A decode-only flag leaves the KV contract alone: no warning for the reviewer.
    assert "KV contract" not in summary
    shutil.copy(checkout / "preview.json", cli.work / "decode.json")


def preview_json(cli: Cli, name: str, **changes) -> dict:
    checkout = cli.checkout(name, **changes)
    return json.loads(cli.run("pulumi preview --json -s sim", cwd=checkout).stdout)


def test_review_of_a_decode_only_edit(cli: Cli) -> None:
    preview = json.loads((cli.work / "decode.json").read_text())
    found = changes(preview)
    containers = {c.role: c for c in found if c.is_container}
    assert set(containers) == DECODE_RANKS
    for rank, change in containers.items():
        assert change.op == "replace" and change.node == NODES[4 + int(rank[-1])]
        assert [(i.kind, i.name) for i in change.inputs] == [("flag", "--max-running-requests")], change.inputs
    waves = [{c.name for c in wave} for wave in order(found)]
    # Ranks >= 1 carry rank 0's id: they are created after it; then the gate and the new drain
    # (the rust router's, whose delete ran first), the admission, the router's readiness and the
    # smoke test.
    rank0, *others = sorted(DECODE_CONTAINERS)
    assert waves == [{rank0}, set(others), {"decode-drain", *(f"{r}-health" for r in DECODE_RANKS)},
                     {"decode-admit"}, {"router-every-group-healthy"}, {"smoke-test-generate"}]
    markdown = render(preview)
    assert "1. replace decode-r0 (10.231.60.5)\n2. replace decode-r1 (10.231.60.6), " \
           "replace decode-r2 (10.231.60.7), replace decode-r3 (10.231.60.8)\n" in markdown


def test_review_of_an_image_change(cli: Cli) -> None:
    preview = preview_json(cli, "image", image="10.231.60.254:5000/kimipd/sim-node:latest")
    found = changes(preview)
    images = [c for c in found if c.type == "docker:index/remoteImage:RemoteImage"]
    assert sorted(c.node for c in images) == NODES
    assert all(any(i.name == "name" and i.new.endswith("sim-node:latest") for i in c.inputs) for c in images)
    containers = {c.role: c for c in found if c.is_container}
    # The door runs its own image: a node image change leaves it as it is.
    assert set(containers) == {"mooncake-master", "router-a", "router-b", *DECODE_RANKS,
                               *(f"prefill-r{r}" for r in range(4))}
    for change in containers.values():
        assert change.op == "replace"
        assert [i.name for i in change.inputs] == ["image"], (change.role, change.inputs)
    waves = [{c.name for c in wave} for wave in order(found)]
    position = {name: i for i, wave in enumerate(waves) for name in wave}
    assert position["node-10-231-60-1-image"] < position["mooncake-master"] \
        < position["node-10-231-60-1-prefill"] < position["node-10-231-60-5-decode"] \
        < position["smoke-test-generate"]
    # The rust router slots (stack sim) start with the nodes, not after decode.
    for slot in ("router-a", "router-b"):
        assert position["node-10-231-60-5-image"] < position[slot] \
            < position["smoke-test-generate"]
    markdown = render(preview)
    assert "| 10.231.60.5 | router-a | container `kimipd-router-a` | replace |" in markdown
    assert "| input `image` |" in markdown
    # The image is SGLang's version and its transfer code: both modes' contract changes.
    assert "#### The KV contract changes" in markdown
    assert "- input `image`:" in markdown and "on `decode`, `prefill`" in markdown


def test_review_of_serving_off(cli: Cli) -> None:
    preview = preview_json(cli, "serving-off", serving=False)
    found = changes(preview)
    assert {c.op for c in found} == {"delete"}
    containers = {c.role: c.node for c in found if c.is_container}
    assert containers == {"mooncake-master": NODES[0], "door": NODES[4], "router-a": NODES[4],
                          "router-b": NODES[4],
                          **{f"prefill-r{r}": NODES[r] for r in range(4)},
                          **{f"decode-r{r}": NODES[4 + r] for r in range(4)}}
    waves = [{c.name for c in wave} for wave in order(found)]
    position = {name: i for i, wave in enumerate(waves) for name in wave}
    assert position["router-a"] < position["node-10-231-60-5-decode"] \
        and position["router-b"] < position["node-10-231-60-5-decode"] \
        < position["node-10-231-60-1-prefill"] < position["mooncake-master"]
    markdown = render(preview)
    assert "| 10.231.60.1 | prefill-r0 | container `kimipd-prefill-r0` | delete |" in markdown
    # The nodes' images stay in the stack; the door's leaves it with the door, and stays on the
    # node (keepLocally), as every image the program pulls.
    assert [c.name for c in found if c.type == "docker:index/remoteImage:RemoteImage"] \
        == ["door-image"], "serving: false must keep the nodes' images"


@pytest.fixture(scope="module")
def policy_pack(cli: Cli) -> Path:
    """policy/ with the virtualenv its PulumiPolicy.yaml names, made by the documented command."""
    pack = REPO / "policy"
    if not (pack / "venv" / "bin" / "python").exists():
        cli.run("python3 -m venv policy/venv && policy/venv/bin/pip install -q -r policy/requirements.txt")
    return pack


def test_the_policy_pack_passes_the_stack_and_refuses_a_privileged_container(
        cli: Cli, policy_pack: Path) -> None:
    passed = cli.run(f"pulumi preview -s sim --policy-pack {policy_pack}")
    assert "kimipd" in passed.stdout and "violation" not in passed.stdout.lower(), passed.stdout[-3000:]
    container = yaml.safe_load((REPO / "Pulumi.sim.yaml").read_text())["config"]["kimipd:container"]
    checkout = cli.checkout("privileged", container=container | {"privileged": True})
    refused = cli.run(f"pulumi preview -s sim --policy-pack {policy_pack}", cwd=checkout, check=False)
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "kimipd-no-privileged" in output and "mandatory" in output.lower(), output[-3000:]
    assert "kimipd-decode-r1: privileged container" in output
    # The pull-request workflow's preview step runs the pack: it fails with the pack's message
    # and writes no summary to post.
    step_summary = cli.work / "refused-step-summary.md"
    workflow = cli.run(workflow_preview_step()["run"], cwd=checkout, check=False,
                       extra={"STACK": "sim", "GITHUB_STEP_SUMMARY": str(step_summary)})
    preview = checkout / "preview.json"
    output = workflow.stdout + workflow.stderr + (preview.read_text() if preview.exists() else "")
    assert workflow.returncode != 0, output[-3000:]
    assert "kimipd-no-privileged" in output and "privileged container" in output, output[-3000:]
    assert not (checkout / "summary.md").exists() and not step_summary.exists()
    allowed = cli.work / "policy-config.json"
    allowed.write_text(json.dumps({"kimipd-no-privileged": {"allowPrivileged": True}}))
    cli.run(f"pulumi preview -s sim --policy-pack {policy_pack} --policy-pack-config {allowed}",
            cwd=checkout)


def test_refresh_then_destroy(cli: Cli) -> None:
    cli.run("pulumi refresh --yes -s sim")
    cli.run("pulumi destroy --yes -s sim")
    assert container_ids(cli.sim) == {}
    for node in NODES:
        assert cli.sim.docker(node, "image", "ls", "-q").stdout.strip(), f"image gone on {node}"
