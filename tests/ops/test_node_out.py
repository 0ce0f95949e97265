"""ops/node_out.py: which resources of a state are on a node taken out, from a real state's
shape (remote commands by their connection, docker resources by their provider), and the
config's out nodes; reconcile's failure lines from engine events."""

from __future__ import annotations

import io
import json
from contextlib import nullcontext

from pulumi import automation as auto

from ops.node_out import (OutUpdate, out_addresses, preview_deletes, resources_on,
                          state_resources)
from ops.policy_pack import PolicyRun
from ops.reconcile import failure_summary
from ops.stack_engine import failures_from_events

P = "urn:pulumi:sim::kimipd::"
CLUSTER = P + "pulumi:pulumi:Stack$kimipd:cluster:Cluster::kimi-k3-pd"
NODE8 = P + "kimipd:cluster:Cluster$kimipd:node:Node::node-10-231-60-8"
GROUP = P + "kimipd:cluster:Cluster$kimipd:serving:ServingGroup::decode-b"
PROVIDER8 = NODE8.replace("kimipd:node:Node::node-10-231-60-8",
                          "kimipd:node:Node$pulumi:providers:docker::node-10-231-60-8-docker")


def entry(urn: str, type_: str, parent: str | None = None, provider: str | None = None,
          **inputs: object) -> dict:
    found = {"urn": urn, "type": type_, "inputs": inputs}
    if parent:
        found["parent"] = parent
    if provider:
        found["provider"] = provider + "::04da6b54-80e4-46f7-96ec-b56ff0331ba9"
    return found


STATE = {"deployment": {"resources": [
    entry(CLUSTER, "kimipd:cluster:Cluster"),
    entry(NODE8, "kimipd:node:Node", CLUSTER),
    entry(NODE8 + "-preflight", "command:remote:Command", NODE8,
          connection={"host": "10.231.60.8", "port": 22}),
    entry(PROVIDER8, "pulumi:providers:docker", NODE8, host="ssh://root@10.231.60.8:22"),
    entry(NODE8 + "-image", "docker:index/remoteImage:RemoteImage", NODE8, PROVIDER8),
    entry(GROUP, "kimipd:serving:ServingGroup", CLUSTER),
    entry(GROUP + "-r0", "docker:index/container:Container", GROUP,
          P + "pulumi:providers:docker::node-10-231-60-7-docker"),
    entry(GROUP + "-r1", "docker:index/container:Container", GROUP, PROVIDER8),
    # Rank 1's gate check on the node out depends on rank 0's container, on a node that stays.
    {**entry(GROUP + "-r1-health", "command:remote:Command", GROUP,
             connection={"host": "10.231.60.8"}), "dependencies": [GROUP + "-r0"]},
    entry(P + "router-x", "command:remote:Command", CLUSTER,
          connection={"host": "10.231.60.5"}),
    # With a private key the whole connection is a secret (the Automation API's export shows
    # it as the signature and the JSON text).
    entry(NODE8 + "-image-env", "command:remote:Command", NODE8, connection={
        "4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270",
        "plaintext": '{"host": "10.231.60.8", "privateKey": "not-a-real-key"}'}),
    entry(P + "other", "command:remote:Command", CLUSTER,
          connection={"host": "10.231.60.80"}),
]}}


def test_the_resources_on_a_node_are_its_commands_its_docker_provider_and_what_it_serves() -> None:
    on = resources_on(state_resources(STATE), ["10.231.60.8"])
    assert on == [NODE8 + "-preflight", PROVIDER8, NODE8 + "-image", GROUP + "-r1",
                  GROUP + "-r1-health", NODE8 + "-image-env"]
    assert "not-a-real-key" not in repr(state_resources(STATE)), "the key is not kept"


def test_a_component_the_update_deletes_goes_with_them_one_it_keeps_does_not() -> None:
    deleted = {NODE8, GROUP, GROUP + "-r0"}
    on = resources_on(state_resources(STATE), ["10.231.60.8"], deleted)
    assert NODE8 in on and GROUP in on
    assert CLUSTER not in on and GROUP + "-r0" not in on, "a rank on a node that stays is deleted"
    assert on.index(NODE8) < on.index(NODE8 + "-preflight"), "parents first (state order)"


def test_the_config_names_its_out_nodes() -> None:
    config = {"kimipd:nodes": {"value": '[{"address": "10.0.0.1"}, '
                                        '{"address": "10.0.0.2", "out": true}]',
                               "objectValue": [{"address": "10.0.0.1"},
                                               {"address": "10.0.0.2", "out": True}],
                               "secret": False}}
    assert out_addresses(config) == ["10.0.0.2"]
    # As the Automation API gives it: JSON text, no objectValue.
    del config["kimipd:nodes"]["objectValue"]
    assert out_addresses(config) == ["10.0.0.2"]
    assert out_addresses({}) == []
    assert preview_deletes([{"op": "delete", "urn": "a"}, {"op": "same", "urn": "b"},
                            {"op": "delete-replaced", "urn": "c"}]) == {"a"}


def diagnostic(urn: str, message: str, severity: str = "error") -> auto.EngineEvent:
    return auto.EngineEvent(sequence=1, timestamp=0, diagnostic_event=auto.DiagnosticEvent(
        message=message, color="never", severity=severity, urn=urn))


def test_a_failed_heal_names_each_failing_resource_and_its_error_lines() -> None:
    drain = P + "kimipd:router:Membership$command:remote:Command::decode-a-drain"
    events = [diagnostic(drain, "  process exited with status 1\nrouter-members: decode-a "
                                "(decode) not drained after 300s: no other decode group"),
              diagnostic(drain, "another line", "info"),
              diagnostic(P + "pulumi:pulumi:Stack::kimipd-sim", "update failed"),
              diagnostic("", "error: no urn")]
    failures = failures_from_events(events)
    assert failures == [{"resource": "decode-a-drain", "type": "command:remote:Command",
                         "error": "process exited with status 1\nrouter-members: decode-a "
                                  "(decode) not drained after 300s: no other decode group"}]
    assert failure_summary(failures, "") == ("decode-a-drain: router-members: decode-a (decode) "
                                             "not drained after 300s: no other decode group")
    assert failure_summary([], "Outputs:\n  x: 1\nerror: update failed\n") == "error: update failed"


class FakeStack:
    """What OutUpdate asks of an Automation API stack, answered from the state above."""

    def __init__(self, config_out: bool = True, fail_up: bool = False) -> None:
        nodes = [{"address": "10.231.60.7"}, {"address": "10.231.60.8", "out": config_out}]
        self.config = {"kimipd:nodes": auto.ConfigValue(value=json.dumps(nodes))}
        self.fail_up = fail_up
        self.calls: list[tuple[str, object]] = []

    def get_all_config(self) -> dict:
        return self.config

    def export_stack(self) -> auto.Deployment:
        return auto.Deployment(version=3, deployment=STATE["deployment"])

    def preview(self, on_event=None, exclude=None, diff=False, on_output=None,
                policy_packs=None, policy_pack_configs=None) -> None:
        self.calls.append(("preview", exclude))
        for urn in (NODE8, GROUP, GROUP + "-r0"):
            if on_event is not None:
                on_event(auto.EngineEvent(sequence=1, timestamp=0, resource_pre_event=(
                    auto.ResourcePreEvent(metadata=auto.StepEventMetadata(
                        op=auto.OpType.DELETE, urn=urn, type="", provider="")))))

    def up(self, exclude=None, diff=False, message=None, on_output=None,
           show_secrets=True, policy_packs=None, policy_pack_configs=None) -> None:
        assert not show_secrets
        # Every update names the policy pack, with this stack's config for it.
        assert (policy_packs, policy_pack_configs) == (POLICY.packs, POLICY.configs)
        self.calls.append(("up", exclude))
        if self.fail_up:
            raise auto.CommandError(auto.CommandResult("", "error: a gate failed", 1))

    def destroy(self, target=None, message=None, on_output=None, show_secrets=True) -> None:
        assert not show_secrets
        self.calls.append(("destroy", target))


POLICY = PolicyRun(packs=["/repo/policy"], configs=["/tmp/policy-config.json"])


class FakeEngine:
    def __init__(self, stack: FakeStack) -> None:
        self.stack = stack

    def policy(self) -> nullcontext[PolicyRun]:
        return nullcontext(POLICY)

    def delete_from_state(self, urns: list[str]) -> None:
        if urns:
            self.stack.calls.append(("state-delete", urns))


def test_up_excludes_the_out_nodes_resources_then_drops_exactly_those() -> None:
    stack, out = FakeStack(), io.StringIO()
    assert OutUpdate(FakeEngine(stack), out).up(diff=False, yes=True) == 0  # type: ignore[arg-type]
    excluded = resources_on(state_resources(STATE), ["10.231.60.8"], {NODE8, GROUP})
    assert ("up", excluded) in stack.calls
    # The engine kept the group's rank on a node that stays (it depends on an excluded one):
    # destroyed for real, before the state delete.
    assert ("destroy", [GROUP + "-r0"]) in stack.calls

    deleted = [urns for name, urns in stack.calls if name == "state-delete"]
    # What depends on the leftover leaves the state first, then the leftover is destroyed,
    # then the rest leaves.
    names = [name for name, _ in stack.calls]
    assert names[-3:] == ["state-delete", "destroy", "state-delete"], names
    assert deleted[0] == [GROUP + "-r1-health"]
    rest = [urn for urn in excluded if urn != GROUP + "-r1-health"]
    assert deleted[1] == list(reversed(rest))
    assert "dropped from the state, none contacted" in out.getvalue()


def test_a_failed_up_drops_nothing_and_an_unconfirmed_one_runs_nothing() -> None:
    failing = FakeStack(fail_up=True)
    assert OutUpdate(FakeEngine(failing), io.StringIO()).up(False, True) == 1  # type: ignore[arg-type]
    assert not [call for call in failing.calls if call[0] == "state-delete"]
    asked = FakeStack()
    update = OutUpdate(FakeEngine(asked), io.StringIO(), confirm=lambda _: "no")  # type: ignore[arg-type]
    assert update.up(False, False) == 1
    assert [name for name, _ in asked.calls] == ["preview", "preview"]


def test_with_no_node_out_it_is_a_plain_up() -> None:
    stack = FakeStack(config_out=False)
    assert OutUpdate(FakeEngine(stack), io.StringIO()).up(False, True) == 0  # type: ignore[arg-type]
    assert stack.calls == [("up", None)]
