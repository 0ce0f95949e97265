"""Commands on the nodes over SSH (paramiko), with the host keys the program pins.

Host keys: `kimipd:connection.knownHostsFile` (else the user's ~/.ssh/known_hosts) plus any
`kimipd:nodes[].hostKey`, and `RejectPolicy`: a node whose key is not pinned, or differs, is
refused, never learnt. Authentication: the `sshPrivateKey` secret, held in memory, and the
ssh-agent. One connection per node, opened once and shared by every command on that node; a node
that cannot be reached fails every later command at once instead of waiting again.
"""

from __future__ import annotations

import base64
import io
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import paramiko

from .stack import Access


class RemoteError(Exception):
    """A node could not run a command (unreachable, host key refused, timed out)."""


class CommandTimeout(RemoteError):
    """SSH answered and ran the command, which did not finish in time: the node is there but
    slow (a docker engine busy starting containers), not lost."""


@dataclass(frozen=True)
class RemoteResult:
    node: str
    command: str
    status: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    @property
    def failure(self) -> str:
        """Why a nonzero exit failed, in a line: stderr's last (200 characters), or `exit N`."""
        lines = self.err.strip().splitlines()
        return lines[-1][:200] if lines else f"exit {self.status}"


class Transport(Protocol):
    """Runs a shell command line on a node. `on_stdout` gets each chunk as it arrives (verify
    times a streamed answer with it)."""

    def run(self, node: str, command: str, timeout: float, stdin: bytes | None = None,
            on_stdout: Callable[[bytes], None] | None = None) -> RemoteResult: ...

    def close(self) -> None: ...


# A read-only probe that timed out on a node whose SSH answered is tried once more, this many
# times longer: a node (or this host) busy starting containers answers late, and a verdict of
# "unknown" for that raised a degraded status and a reconcile decision out of nothing.
SLOW_NODE_FACTOR = 3


def run_patiently(transport: Transport, node: str, command: str, timeout: float) -> RemoteResult:
    """TRANSPORT.run of a read-only COMMAND, once more with SLOW_NODE_FACTOR x TIMEOUT after a
    CommandTimeout (never after a connection failure: a lost node stays quick to call lost)."""
    try:
        return transport.run(node, command, timeout=timeout)
    except CommandTimeout:
        return transport.run(node, command, timeout=SLOW_NODE_FACTOR * timeout)


def load_private_key(text: str) -> paramiko.PKey:
    """The `sshPrivateKey` secret (OpenSSH or PEM text) as a key object, without touching disk."""
    problems = []
    for key_class in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return key_class.from_private_key(io.StringIO(text))
        except paramiko.PasswordRequiredException:
            raise RemoteError("kimipd:sshPrivateKey is passphrase-protected: load it into "
                              "ssh-agent instead and unset the secret") from None
        except (paramiko.SSHException, ValueError, IndexError) as error:
            problems.append(f"{key_class.__name__}: {error}")
    raise RemoteError("kimipd:sshPrivateKey is not a private key paramiko reads ("
                      + "; ".join(problems) + ")")


def _host_entry(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class SshTransport:
    def __init__(self, access: Access, connect_timeout: float = 5.0) -> None:
        self.access = access
        self.connect_timeout = connect_timeout
        self._pkey = load_private_key(access.private_key) if access.private_key else None
        self._lock = threading.Lock()
        self._node_locks: dict[str, threading.Lock] = {}
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._failures: dict[str, str] = {}

    def _known_hosts(self, client: paramiko.SSHClient, address: str) -> None:
        path = self.access.known_hosts_file
        if path is not None:
            file = os.path.expanduser(path)
            if not os.path.isfile(file):
                raise RemoteError(f"kimipd:connection.knownHostsFile {path!r} does not exist on "
                                  "this machine")
            client.load_host_keys(file)
        else:
            client.load_system_host_keys()
        node = self.access.node(address)
        if node.host_key:
            key_type, key_data = node.host_key.split()[:2]
            key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_data))
            client.get_host_keys().add(_host_entry(address, node.ssh_port), key_type, key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())

    def _connect(self, address: str) -> paramiko.SSHClient:
        node = self.access.node(address)
        client = paramiko.SSHClient()
        self._known_hosts(client, address)
        pinned_in = self.access.known_hosts_file or "~/.ssh/known_hosts"
        timeout = self.connect_timeout
        try:
            client.connect(address, port=node.ssh_port, username=node.ssh_user, pkey=self._pkey,
                           allow_agent=True, look_for_keys=False, timeout=timeout,
                           banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout)
        except paramiko.BadHostKeyException:
            client.close()
            raise RemoteError(f"ssh {address}: host key differs from the one pinned in "
                              f"{pinned_in}: refused (check the node's fingerprint)") from None
        except paramiko.AuthenticationException:
            client.close()
            raise RemoteError(f"ssh {node.ssh_user}@{address}:{node.ssh_port}: authentication "
                              "failed (kimipd:sshPrivateKey or ssh-agent)") from None
        except paramiko.SSHException as error:
            client.close()
            if "not found in known_hosts" in str(error):
                raise RemoteError(f"ssh {address}: no host key pinned in {pinned_in} nor in "
                                  "kimipd:nodes[].hostKey: refused (ssh-keyscan, then compare "
                                  "the fingerprint)") from None
            raise RemoteError(f"ssh {address}: {error}") from None
        except (socket.timeout, TimeoutError):
            client.close()
            raise RemoteError(f"ssh {address}:{node.ssh_port}: no answer within "
                              f"{timeout:g}s") from None
        except OSError as error:
            client.close()
            raise RemoteError(f"ssh {address}:{node.ssh_port}: "
                              f"{error.strerror or error}") from None
        return client

    def _client(self, address: str) -> paramiko.SSHClient:
        with self._lock:
            node_lock = self._node_locks.setdefault(address, threading.Lock())
        # One connection attempt per node at a time; the others wait for its outcome.
        with node_lock:
            if address in self._failures:
                raise RemoteError(self._failures[address])
            client = self._clients.get(address)
            transport = client.get_transport() if client else None
            if client is not None and transport is not None and transport.is_active():
                return client
            try:
                client = self._connect(address)
            except RemoteError as error:
                self._failures[address] = str(error)
                raise
            self._clients[address] = client
            return client

    def forget_failures(self) -> None:
        """Try unreachable nodes again (each round of `status --watch`)."""
        with self._lock:
            self._failures.clear()

    def _drop(self, node: str) -> None:
        with self._lock:
            client = self._clients.pop(node, None)
        if client is not None:
            client.close()

    def run(self, node: str, command: str, timeout: float, stdin: bytes | None = None,
            on_stdout: Callable[[bytes], None] | None = None) -> RemoteResult:
        client = self._client(node)
        try:
            transport = client.get_transport()
            if transport is None:  # closed since _client returned it (another command dropped it)
                raise paramiko.SSHException("the connection was closed")
            channel = transport.open_session(timeout=timeout)
            channel.settimeout(0.05)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError) as error:
            self._drop(node)  # a broken connection: the next command connects again
            raise RemoteError(f"ssh {node}: {error}") from None
        stdout, stderr = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            while True:
                busy = False
                if channel.recv_ready():
                    chunk = channel.recv(65536)
                    if chunk:
                        stdout += chunk
                        if on_stdout is not None:
                            on_stdout(chunk)
                    busy = True
                if channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(65536)
                    busy = True
                # The end is the channel's EOF, not the exit status: sshd sends that when the
                # command exits, maybe before its last output (a child holding stdout, a pipe
                # not yet drained); read only to it, a busy node's `docker inspect` was cut.
                if (channel.exit_status_ready() and channel.eof_received
                        and not channel.recv_ready() and not channel.recv_stderr_ready()):
                    break
                if time.monotonic() > deadline:
                    raise CommandTimeout(f"ssh {node}: `{_short(command)}` did not finish within "
                                      f"{timeout:g}s")
                if not busy:
                    time.sleep(0.005)
            return RemoteResult(node, command, channel.recv_exit_status(), bytes(stdout),
                                bytes(stderr))
        except (paramiko.SSHException, OSError, EOFError) as error:
            self._drop(node)
            raise RemoteError(f"ssh {node}: {error}") from None
        finally:
            channel.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


def _short(command: str, limit: int = 60) -> str:
    line = " ".join(command.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
