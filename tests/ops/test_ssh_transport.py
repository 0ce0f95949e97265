"""ops/remote.SshTransport against a real sshd (Debian's openssh-server) on loopback, started
by the test with a host key and an authorized key of its own: an answer is read whole, up to the
channel's end, not only until the exit status (which sshd may send before the last output)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from components.config import NodeSpec
from ops.remote import SshTransport
from ops.stack import Access

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _key_pair(path: Path) -> tuple[str, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    path.write_text(private)
    path.chmod(0o600)
    return private, public


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshTransport]:
    if not Path(SSHD).exists():
        pytest.fail("sshd is missing: scripts/test installs Debian's openssh-server")
    _, host_public = _key_pair(tmp_path / "host_key")
    client_private, client_public = _key_pair(tmp_path / "client_key")
    (tmp_path / "authorized_keys").write_text(client_public + "\n")
    port = _free_port()
    (tmp_path / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path / 'host_key'}\n"
        f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}\nStrictModes no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        f"PidFile none\nPermitRootLogin prohibit-password\n")
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_public}\n")
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(tmp_path / "sshd_config")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    transport = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "sshd did not listen within 30 s"
                time.sleep(0.1)
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        access = Access(known_hosts_file=str(tmp_path / "known_hosts"),
                        nodes={"127.0.0.1": NodeSpec(address="127.0.0.1", sshPort=port,
                                                     sshUser=user)},
                        private_key=client_private)
        transport = SshTransport(access)
        yield transport
    finally:
        if transport is not None:
            transport.close()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_an_answer_is_read_to_the_channels_end_not_to_the_exit_status(
        sshd: SshTransport) -> None:
    """The shell exits at once (sshd sends its exit status then) while a child it left holds
    stdout and writes 300 kB half a second later: what `docker inspect` of a busy node's
    containers looked like when status read it cut short (a JSON array with no end)."""
    command = "(sleep 0.5; head -c 300000 /dev/zero | tr '\\0' x) & exit 3"
    result = sshd.run("127.0.0.1", command, timeout=30)
    assert (result.status, len(result.stdout)) == (3, 300000), (result.status,
                                                                len(result.stdout))


def test_a_quick_command_and_its_stderr(sshd: SshTransport) -> None:
    result = sshd.run("127.0.0.1", "echo out; echo err >&2; exit 0", timeout=30)
    assert (result.status, result.out, result.err) == (0, "out\n", "err\n")
