"""Reading an exported state (ops/state_urns.py): the URNs of named containers on their nodes."""

from __future__ import annotations

from ops.state_urns import container_urns, docker_host_address

PROVIDER = "urn:pulumi:s::kimipd::pulumi:providers:docker::node-{n}-docker"
CONTAINER = "urn:pulumi:s::kimipd::kimipd:node:Node$docker:index/container:Container::{name}"


def export(*containers: tuple[int, str]) -> dict:
    resources = [{"urn": PROVIDER.format(n=n), "type": "pulumi:providers:docker",
                  "inputs": {"host": f"ssh://root@10.0.0.{n}:22"}} for n in (1, 2)]
    resources += [{"urn": CONTAINER.format(name=f"node-{n}-{name}"),
                   "type": "docker:index/container:Container",
                   "provider": PROVIDER.format(n=n) + "::0f3a-id",
                   "outputs": {"name": name}} for n, name in containers]
    return {"deployment": {"resources": resources}}


def test_a_container_is_found_by_its_name_on_its_node_only() -> None:
    state = export((1, "kimipd-decode-r0"), (2, "kimipd-decode-r0"), (2, "kimipd-decode-r1"))
    assert container_urns(state, [("10.0.0.2", "kimipd-decode-r0")]) == [
        CONTAINER.format(name="node-2-kimipd-decode-r0")]
    assert container_urns(state, [("10.0.0.3", "kimipd-decode-r0")]) == []
    assert container_urns({}, [("10.0.0.1", "kimipd-decode-r0")]) == []


def test_the_docker_host_address_is_the_node() -> None:
    assert docker_host_address("ssh://root@10.0.0.8:22") == "10.0.0.8"
    assert docker_host_address("ssh://root@10.0.0.8") == "10.0.0.8"
    assert docker_host_address("unix:///var/run/docker.sock") is None
