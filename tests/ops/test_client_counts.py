"""The door's requests per client: `show table door_clients` read, and exported by reconcile."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ops.door import RuntimeApiError, parse_client_counts
from ops.reconcile_metrics import client_families

SHOW_TABLE = """# table: door_clients, type: string, size:1024, used:2
0x5602068cd128: key=alice use=0 exp=0 http_req_cnt=12
0x5602068cda48: key=kimipd use=1 exp=0 http_req_cnt=340

"""


def test_show_table_gives_each_clients_count() -> None:
    assert parse_client_counts(SHOW_TABLE) == {"alice": 12, "kimipd": 340}


def test_an_answer_that_is_not_a_table_is_an_error() -> None:
    with pytest.raises(RuntimeApiError, match="without its header"):
        parse_client_counts("Unknown command: 'show tabel'\n")


def test_reconcile_exports_them_per_node_and_client() -> None:
    families = client_families("sim", {"10.0.0.5": {"alice": 12, "kimipd": 340}})

    class Families:
        def collect(self):
            return families

    registry = CollectorRegistry()
    registry.register(Families())
    text = generate_latest(registry).decode()
    assert 'kimipd_door_client_requests_total{client="alice",node="10.0.0.5",stack="sim"} 12.0' \
        in text, text
    assert client_families("sim", {}) == [] and client_families("sim", None) == []
