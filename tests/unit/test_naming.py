"""components/render/naming.py against what it names: the project, the nodes' resource names, and
a firewall URN as the engine makes it."""

from __future__ import annotations

import yaml

from components.config import NodeSpec
from components.render import firewall_urn, node_resource_name
from components.render.naming import PROJECT
from tests.conftest import REPO


def test_the_project_is_pulumi_yamls() -> None:
    assert yaml.safe_load((REPO / "Pulumi.yaml").read_text())["name"] == PROJECT


def test_a_nodes_resources_are_named_as_its_spec_names_them() -> None:
    assert node_resource_name("10.231.60.7") == NodeSpec(address="10.231.60.7").resource_name



def test_the_firewall_urn_names_the_component_chain() -> None:
    """The engine's URN of the table's command: the parents' types, then its own, then its name.
    (Pulumi's mocks make URNs without the parents' types; tests/integration/test_security.py
    replaces a lost table through the URN `kimipd status` prints, on the real engine.)"""
    assert firewall_urn("sim", "10.231.60.4") == (
        "urn:pulumi:sim::kimipd::kimipd:cluster:Cluster$kimipd:node:Node$"
        "kimipd:firewall:NodeFirewall$command:remote:Command::node-10-231-60-4-nftables")
