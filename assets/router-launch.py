#!/usr/bin/env python3
"""Starts sglang-router with its API key read from a file, never from the command line.

  router-launch.py --api-key-file FILE -- ROUTER-ARGS...

The key is appended to the router's own argv inside this process (sys.argv), so `ps` and
`docker inspect` show the file's path, not the key.
"""

import runpy
import sys


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 3 or argv[0] != "--api-key-file" or argv[2] != "--":
        sys.exit("usage: router-launch.py --api-key-file FILE -- ROUTER-ARGS...")
    with open(argv[1], encoding="utf-8") as stream:
        key = stream.read().strip()
    if not key:
        sys.exit(f"router-launch.py: {argv[1]} is empty; the router would run without a key")
    sys.argv = ["sglang_router.launch_router", *argv[3:], "--api-key", key]
    runpy.run_module("sglang_router.launch_router", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
