"""A host on the sim's network that is no node: a network namespace of the test's own making on
the sim's bridge, with an address no node has. Every test that plays a stranger uses this one."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

STRANGER_NS = "kimipd-stranger"
STRANGER = "10.231.60.200"
BRIDGE = "kpdbr0"
VETH = "kpdstranger"


@contextmanager
def stranger_namespace() -> Iterator[str]:
    """The stranger's namespace, up for the block and removed after it; yields its address."""
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    subprocess.run(["ip", "netns", "del", STRANGER_NS], capture_output=True)
    subprocess.run(["ip", "link", "del", VETH], capture_output=True)
    ip("netns", "add", STRANGER_NS)
    try:
        ip("link", "add", VETH, "type", "veth", "peer", "name", "eth0", "netns", STRANGER_NS)
        ip("link", "set", VETH, "master", BRIDGE, "up")
        ip("-n", STRANGER_NS, "addr", "add", f"{STRANGER}/24", "dev", "eth0")
        ip("-n", STRANGER_NS, "link", "set", "eth0", "up")
        ip("-n", STRANGER_NS, "link", "set", "lo", "up")
        yield STRANGER
    finally:
        subprocess.run(["ip", "link", "del", VETH], capture_output=True)
        subprocess.run(["ip", "netns", "del", STRANGER_NS], capture_output=True)
