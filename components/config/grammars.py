"""Value grammars: what docker, ssh and the kernel accept, checked before anything runs."""

from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import re
from collections.abc import Iterable

# Public host key types an sshd offers (what ssh-keyscan and known_hosts carry).
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                  "ecdsa-sha2-nistp521", "ssh-rsa", "sk-ssh-ed25519@openssh.com",
                  "sk-ecdsa-sha2-nistp256@openssh.com")
_FINGERPRINT = re.compile(r"(?:SHA256|MD5):\S+|(?:[0-9a-fA-F]{2}:){15}[0-9a-fA-F]{2}")


def host_key_problem(value: str) -> str | None:
    """Why VALUE is not `TYPE BASE64` of a public host key, or None."""
    fields = value.split()
    if _FINGERPRINT.fullmatch(value.strip()):
        return "is a fingerprint, not a key (ssh shows fingerprints, but pins the key itself)"
    if len(fields) == 3 and fields[1] in HOST_KEY_TYPES:
        return (f"starts with the host name {fields[0]!r} (a known_hosts line); hostKey is the "
                "key alone")
    if len(fields) != 2 or fields[0] not in HOST_KEY_TYPES:
        return f"is not `TYPE BASE64` with TYPE one of {', '.join(HOST_KEY_TYPES)}"
    try:
        blob = base64.b64decode(fields[1], validate=True)
    except (binascii.Error, ValueError):
        return "has a key part that is not base64"
    length = int.from_bytes(blob[:4], "big")
    if blob[4:4 + length] != fields[0].encode():
        return f"has a key part that is not a {fields[0]} key (copied from another line?)"
    return None


# docker's reference grammar (distribution/reference): [HOST[:PORT]/]PATH[:TAG][@DIGEST].
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:(?P<domain>{_DOMAIN})/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?",
    re.ASCII)


def image_reference_problem(value: str) -> str | None:
    """Why docker would refuse VALUE as an image reference, or None."""
    if not value.strip():
        return "is empty"
    if value != value.strip() or any(c.isspace() for c in value):
        return "contains whitespace"
    if value.endswith(":") or ":@" in value:
        return "has an empty tag"
    if value.endswith("@"):
        return "has an empty digest"
    match = IMAGE_REFERENCE.fullmatch(value)
    if match is None:
        if value.lower() != value and IMAGE_REFERENCE.fullmatch(value.lower()):
            return "has upper-case letters in its repository name (docker wants lower case)"
        return "does not follow docker's reference grammar"
    domain = match.group("domain")
    # docker reads a first component as a registry only if it has a `.` or `:` or is localhost.
    if domain is not None and not ("." in domain or ":" in domain or domain == "localhost") \
            and domain.lower() != domain:
        return "has upper-case letters in its repository name (docker wants lower case)"
    if len(match.group("name")) > 255:
        return "has a name longer than 255 characters"
    return None


def checked_ipv4(value: str, what: str) -> str:
    """VALUE, or the validation error saying it is not an IPv4 address and WHAT to write."""
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 address; write {what}") from None
    return value


def checked_image_reference(value: str, form: str) -> str:
    """VALUE, or the validation error naming why docker would refuse it and the FORM to write."""
    problem = image_reference_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r} {problem}, so docker cannot pull it; write {form}")
    return value


# docker's `--ulimit` names (docker/go-units ulimit.go).
ULIMIT_NAMES = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile",
                "nproc", "rss", "rtprio", "rttime", "sigpending", "stack")
# Linux capabilities (linux/capability.h); docker takes them with or without CAP_, or ALL.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the one choice WORD is probably a misspelling of, else ``."""
    folded = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=0.6)
    # An abbreviation (`dest`) is far from its word by edit distance, but only one word starts so.
    close = close or [f for f in folded if f.startswith(word.lower())][:2]
    return f" (did you mean {folded[close[0]]!r}?)" if len(close) == 1 else ""


def absolute_path(value: str, what: str, example: str) -> str:
    """VALUE unchanged if it is an absolute path; else a ValueError naming WHAT it is for."""
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path; {what}: write the full path, "
                         f"e.g. {example}")
    return value
