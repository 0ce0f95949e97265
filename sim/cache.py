"""KIMIPD_CACHE (default ~/.cache/kimipd): where sim/sim keeps the sim's SSH key, known_hosts and
node files, and how the sim stack files' paths to them follow it.

The sim stack files (Pulumi.sim.yaml, Pulumi.sim-2p2d.yaml, observability/Pulumi.sim.yaml) name
those files under the default cache. A sim brought up under another KIMIPD_CACHE has them under
that one, and the default cache may hold another sim's (stale host keys: "REMOTE HOST
IDENTIFICATION HAS CHANGED"). So whatever dials the sim reads a stack file's values through
`follow_cache`: the tests' and the bench's own stacks, and scripts/setup-stack-sim, which sets
them in the repository's stack `sim` with `pulumi config set` (`python3 sim/cache.py
config-paths` lists them) and whose git clean filter writes them back as the default cache's.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

DEFAULT_CACHE = "~/.cache/kimipd"
# The part of a path before the sim's SSH material or node files is the cache: it runs from a
# word boundary (space, quote, `=` as in IdentityFile=..., a YAML/JSON bracket or comma).
# scripts/setup-stack-sim --git-clean applies the same rule to the file's text.
CACHE_PART = re.compile(r"[^\s\"'=,\[\]{}]+(?=/sim/(?:ssh|node-files)/)")
_BOUNDARY = re.compile(r"[\s\"'=,\[\]{}]")


def cache_dir() -> str:
    """The cache in use as a stack file writes it: the default as ~/.cache/kimipd, another
    absolute."""
    cache = os.environ.get("KIMIPD_CACHE", "")
    if not cache:  # unset or empty, as ${KIMIPD_CACHE:-...} in the scripts
        return DEFAULT_CACHE
    path = os.path.abspath(os.path.expanduser(cache))
    if Path(path).resolve() == Path(DEFAULT_CACHE).expanduser().resolve():
        return DEFAULT_CACHE
    if _BOUNDARY.search(path):
        # A space would also split the IdentityFile option ssh reads from dockerSshOpts.
        raise ValueError(f"KIMIPD_CACHE={cache!r}: a stack file's paths under it could not be "
                         "told from what surrounds them (a space, quote, '=', ',' or bracket); "
                         "use a directory whose path has none")
    return path


def follow_cache(value: Any, cache: str | None = None) -> Any:
    """VALUE (a stack's values or any part of them) with the sim's paths under CACHE (default:
    the cache in use), whichever cache they named before."""
    cache = cache_dir() if cache is None else cache
    if isinstance(value, str):
        return CACHE_PART.sub(lambda _: cache, value)
    if isinstance(value, dict):
        return {key: follow_cache(item, cache) for key, item in value.items()}
    if isinstance(value, list):
        return [follow_cache(item, cache) for item in value]
    return value


def config_paths(config: dict[str, Any], namespace: str = "kimipd",
                 cache: str | None = None) -> list[tuple[str, str]]:
    """From `pulumi config --json`, each (`--path` key, value) of a sim path that names another
    cache than CACHE (default: the cache in use), with the value under CACHE."""
    cache = cache_dir() if cache is None else cache
    changes: list[tuple[str, str]] = []

    def walk(key: str, value: Any) -> None:
        if isinstance(value, str):
            followed = follow_cache(value, cache)
            if followed != value:
                changes.append((key, followed))
        elif isinstance(value, dict):
            for name, item in value.items():
                walk(f"{key}.{name}", item)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(f"{key}[{index}]", item)

    for full_key, entry in sorted(config.items()):
        space, _, name = full_key.partition(":")
        if space != namespace or entry.get("secret"):
            continue
        walk(name, entry["objectValue"] if "objectValue" in entry else entry.get("value"))
    return changes


def main(argv: list[str]) -> int:
    if argv != ["config-paths"]:
        print("usage: pulumi config --json | python3 sim/cache.py config-paths\n"
              "  prints KEY<tab>VALUE (a `--path` key) for each sim path of the stack that names\n"
              "  another cache than KIMIPD_CACHE, the value under KIMIPD_CACHE", file=sys.stderr)
        return 2
    try:
        changes = config_paths(json.load(sys.stdin))
    except ValueError as error:
        print(f"sim/cache.py: {error}", file=sys.stderr)
        return 1
    for key, value in changes:
        print(f"{key}\t{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
