"""ops/node_out.py: which resources of a state are on a node taken out, from a real state's
shape (remote commands by their connection, docker resources by their provider), and the
config's out nodes; reconcile's failure lines from engine events."""

from __future__ import annotations

from pulumi import automation as auto

from ops.node_out import out_addresses, preview_deletes, resources_on, state_resources
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
    entry(P + "router-x", "command:remote:Command", CLUSTER,
          connection={"host": "10.231.60.5"}),
    entry(P + "other", "command:remote:Command", CLUSTER,
          connection={"host": "10.231.60.80"}),
]}}


def test_the_resources_on_a_node_are_its_commands_its_docker_provider_and_what_it_serves() -> None:
    on = resources_on(state_resources(STATE), ["10.231.60.8"])
    assert on == [NODE8 + "-preflight", PROVIDER8, NODE8 + "-image", GROUP + "-r1"]


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
                                               {"address": "10.0.0.2", "out": True}]}}
    assert out_addresses(config) == ["10.0.0.2"]
    assert out_addresses({}) == []
    assert preview_deletes([{"op": "delete", "urn": "a"}, {"op": "same", "urn": "b"},
                            {"op": "delete-replaced", "urn": "c"}]) == {"a", "c"}


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
