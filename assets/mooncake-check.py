"""Proves, inside a container, which Mooncake Python will import (launch.sh runs it).

The image ships Mooncake 0.3.11.post1 as distribution `mooncake-transfer-engine`; the node file is
`mooncake-transfer-engine-cuda13` 0.3.12.post1. Both install the package `mooncake/`, so
`pip install --force-reinstall` of one over the other overwrites files but leaves two
distributions, and pip's metadata no longer says which one's files are on disk. So:

  remove-others WHEEL  uninstall every Mooncake distribution except the wheel's own (before the
                       wheel is installed);
  verify MIN           the distribution whose RECORD matches the `mooncake/__init__.py` Python
                       resolves is the only Mooncake distribution, and its version >= MIN;
  binary NAME          print the path of a binary shipped inside that package (mooncake_master).

Runbook rule 3: Mooncake >= 0.3.12.post1 (dmabuf registration fix, Mooncake #2035). Stdlib only:
this runs with the image's own python3, before anything else is known to work.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from importlib import metadata

PACKAGE = "mooncake"
RULE = "runbook rule 3: Mooncake >= {minimum} (dmabuf registration fix, Mooncake #2035)"


def version_key(version: str) -> tuple:
    """`0.3.12.post1` -> (0, 3, 12, 1); a release without `.postN` sorts before its posts."""
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", version)
    if not match:
        return (-1,)
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch), int(post) if post is not None else -1


def mooncake_distributions() -> list:
    """Every installed distribution that ships files of the `mooncake` package."""
    found = {}
    for dist in metadata.distributions():
        files = dist.files or []
        if any(str(f).startswith(PACKAGE + "/") for f in files):
            found[dist.metadata["Name"]] = dist
    return list(found.values())


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def remove_others(wheel: str) -> int:
    keep = normalized(os.path.basename(wheel).split("-")[0])
    others = [d.metadata["Name"] for d in mooncake_distributions()
              if normalized(d.metadata["Name"]) != keep]
    if not others:
        return 0
    print(f"mooncake-check: uninstalling {', '.join(others)} (the image's Mooncake) before "
          f"installing {os.path.basename(wheel)}")
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1")
    return subprocess.call([sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet",
                            *others], env=env)


def record_digest(dist, relative: str) -> str | None:
    for entry in dist.files or []:
        if str(entry) == relative and entry.hash is not None:
            return entry.hash.value
    return None


def file_digest(path: str) -> str:
    with open(path, "rb") as stream:
        digest = hashlib.sha256(stream.read()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def imported_package_dir() -> str | None:
    # find_spec only locates the package: importing it would load the CUDA-linked engine.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def verify(minimum: str) -> int:
    rule = RULE.format(minimum=minimum)
    package_dir = imported_package_dir()
    if package_dir is None:
        print(f"mooncake-check: no `mooncake` package importable; {rule}: ship the Mooncake "
              f"wheel in nodeFiles.", file=sys.stderr)
        return 1
    dists = mooncake_distributions()
    names = ", ".join(f"{d.metadata['Name']} {d.version}" for d in dists)
    if len(dists) != 1:
        print(f"mooncake-check: {len(dists)} Mooncake distributions installed ({names}); files "
              f"of one shadow the other, so the version that runs is unknown; {rule}: launch.sh "
              f"uninstalls the image's before installing the wheel - check nodeFiles ships "
              f"exactly one mooncake_transfer_engine*.whl.", file=sys.stderr)
        return 1
    dist = dists[0]
    init = os.path.join(package_dir, "__init__.py")
    recorded = record_digest(dist, f"{PACKAGE}/__init__.py")
    if recorded is not None and os.path.exists(init) and file_digest(init) != recorded:
        print(f"mooncake-check: {init} is not the file {dist.metadata['Name']} {dist.version} "
              f"installed (another copy shadows it on sys.path); {rule}.", file=sys.stderr)
        return 1
    if version_key(dist.version) < version_key(minimum):
        print(f"mooncake-check: Python imports Mooncake {dist.version} "
              f"({dist.metadata['Name']}, {package_dir}); {rule}: ship the {minimum} wheel "
              f"or newer in nodeFiles.", file=sys.stderr)
        return 1
    print(f"mooncake-check: Mooncake {dist.version} ({dist.metadata['Name']}) at {package_dir}: "
          f"ok (>= {minimum})")
    return 0


def binary(name: str) -> int:
    package_dir = imported_package_dir()
    path = os.path.join(package_dir or "", name)
    if package_dir is None or not os.path.isfile(path):
        print(f"mooncake-check: no {name} binary in the mooncake package ({package_dir})",
              file=sys.stderr)
        return 1
    if not os.access(path, os.X_OK):
        # pip does not keep the mode bits of wheel members; Mooncake's own cli.py does this too.
        os.chmod(path, os.stat(path).st_mode | 0o111)
    print(path)
    return 0


def main(argv: list) -> int:
    commands = {"remove-others": remove_others, "verify": verify, "binary": binary}
    if len(argv) != 2 or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
