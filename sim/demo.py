"""The README's demo: `pulumi up` of stack `sim` on the simulated cluster, then /generate.

The stack is the repository's own, exactly as the CLI in the repository root sees it:
scripts/setup-stack-sim sets it up (Pulumi.sim.yaml plus the image pin and the SSH key it writes
there with `pulumi config set`, the file backend under $KIMIPD_CACHE/state, the cache defaulting
to ~/.cache/kimipd), and the engine runs `__main__.py` through the language host. So `pulumi
preview --diff -s sim` right after the demo is a no-op, and a second run converges the same
stack: a no-op unless something changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from components.outputs import read_outputs
from sim.automation import (
    REPO, REQUIRED_PLUGINS, engine_env, installed_plugins, language_host_missing, repo_stack,
    sim_stack_env)

CACHE = Path(os.environ.get("KIMIPD_CACHE", Path.home() / ".cache" / "kimipd"))
SIM = REPO / "sim" / "sim"


def sim_up() -> None:
    subprocess.run([str(SIM), "up"], check=True)
    # Nothing may be sent to 10.231.60.x unless the sim's bridge carries it.
    subprocess.run([str(SIM), "status"], check=True, stdout=subprocess.DEVNULL)


def generate(url: str, text: str, api_key: str) -> dict:
    """POST /generate as a client does: with the router's key (every server requires it)."""
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 16}}).encode()
    request = urllib.request.Request(url, data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def main() -> int:
    env = engine_env()
    missing = REQUIRED_PLUGINS - installed_plugins(env)
    if missing:
        names = ", ".join(f"pulumi-resource-{name} v{version}" for name, version in sorted(missing))
        print(f"demo: the engine is ready but these resource plugins are not: {names}.\n"
              "  With internet access, scripts/install-pulumi installs them from the official "
              "source; offline, put the official\n  plugin files in "
              f"{CACHE}/pulumi/dropin/ (docs/air-gapped.md) and run the demo again.",
              file=sys.stderr)
        return 2
    sim_up()
    env = sim_stack_env()
    missing_host = language_host_missing(env)
    if missing_host:
        print(f"demo: {missing_host} is missing, so the program runs inline in this process (same "
              "stack file, same state); the pulumi CLI alone cannot run it here.", file=sys.stderr)
    stack = repo_stack(env)
    # What the nodes really run (a container may have died or been removed since the last run).
    stack.refresh()
    started = time.monotonic()
    result = stack.up(on_output=print)
    outputs = read_outputs({key: value.value for key, value in result.outputs.items()})
    print(f"\npulumi up -s sim: {time.monotonic() - started:.0f}s, "
          f"{dict(result.summary.resource_changes or {})}")
    print(f"router:     {outputs.router_url}")
    door = outputs.door
    if door is not None:
        slots = ", ".join(f"{name} {slot.url}" for name, slot in sorted(door.slots.items()))
        print(f"door:       HAProxy on {door.url}, slots {slots}")
    print(f"smoke test: {outputs.smoke_test!r}")
    answer = generate(str(outputs.generate_url), "Hello from the kimipd demo",
                      outputs.router_api_key or "")
    print(f"/generate:  {answer['text']!r}")
    print("\nthe same stack from the CLI, in the repository root:\n"
          '  eval "$(scripts/setup-stack-sim)"\n'
          "  pulumi preview --diff -s sim      # nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
