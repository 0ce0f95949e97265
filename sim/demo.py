"""The README's demo: `pulumi up` of stack `sim` on the simulated cluster, then /generate.

Runs the real engine through the Automation API (program inline, file backend under
~/.cache/kimipd/demo), so a second run converges the same stack: a no-op unless something changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pulumi import automation as auto

from components.config import read_stack_file
from sim.automation import (
    REPO, REQUIRED_PLUGINS, Project, engine_env, installed_plugins, sim_exports)

CACHE = Path(os.environ.get("KIMIPD_CACHE", Path.home() / ".cache" / "kimipd"))
SIM = REPO / "sim" / "sim"


def sim_env() -> dict[str, str]:
    subprocess.run([str(SIM), "up"], check=True)
    # Nothing may be sent to 10.231.60.x unless the sim's bridge carries it.
    subprocess.run([str(SIM), "status"], check=True, stdout=subprocess.DEVNULL)
    return sim_exports()


def generate(url: str, text: str) -> dict:
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 16}}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
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
              f"{CACHE}/pulumi/dropin/ (see scripts/install-pulumi) and run the demo again.",
              file=sys.stderr)
        return 2
    sim = sim_env()
    project = Project(CACHE / "demo", env)
    project.write_stack("sim", read_stack_file(REPO / "Pulumi.sim.yaml")
                        | {"image": sim["KIMIPD_SIM_IMAGE"]})
    stack = project.stack("sim")
    stack.set_config("kimipd:sshPrivateKey", auto.ConfigValue(
        value=Path(sim["KIMIPD_SIM_KEY"]).read_text(), secret=True))
    # What the nodes really run (a container may have died or been removed since the last run).
    stack.refresh()
    started = time.monotonic()
    result = stack.up(on_output=print)
    outputs = {key: value.value for key, value in result.outputs.items()}
    print(f"\npulumi up -s sim: {time.monotonic() - started:.0f}s, "
          f"{dict(result.summary.resource_changes or {})}")
    print(f"router:     {outputs['routerUrl']}")
    print(f"smoke test: {outputs['smokeTest']!r}")
    answer = generate(outputs["generateUrl"], "Hello from the kimipd demo")
    print(f"/generate:  {answer['text']!r}")
    print(f"\nstate: {project.directory} (PULUMI_BACKEND_URL=file://{project.state}, "
          "PULUMI_CONFIG_PASSPHRASE=kimipd-tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
