"""B4: what the program itself costs as the cluster grows, under Pulumi's mocks.

The sim has 8 nodes, so larger clusters exist only as generated stacks: N nodes in groups of 4
(prefill and decode alternating), previewed by the real `__main__.py` under `set_mocks`
(preview=True), each size in a fresh interpreter so that its peak RSS is its own. What this
measures is the program (model, renderers, components, registrations), not the engine or the
providers.

`python -m bench.program_cost --nodes N` runs one size and prints its figures as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sim.automation import REPO

GROUP_SIZE = 4


def high_water_mib() -> float:
    """This process's peak RSS (VmHWM). Not getrusage's ru_maxrss: Linux carries that across
    execve, so a child would report the parent's size at fork."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def generated_values(nodes: int, directory: Path) -> dict[str, Any]:
    """Pulumi.sim.yaml grown to NODES nodes: groups of 4, prefill and decode alternating."""
    from components.config import read_stack_file
    from tests.program.harness import with_local_files

    if nodes % (2 * GROUP_SIZE):
        raise ValueError(f"--nodes {nodes}: a multiple of {2 * GROUP_SIZE} (one P and one D group)")
    values = copy.deepcopy(read_stack_file(REPO / "Pulumi.sim.yaml"))
    # Never dialled: the mocks answer every registration.
    addresses = [f"10.240.{i // 250}.{i % 250 + 1}" for i in range(nodes)]
    values["nodes"] = [{"address": address, "gpus": 8} for address in addresses]
    template = values["groups"]
    values["groups"] = {}
    for index in range(nodes // GROUP_SIZE):
        mode = "prefill" if index % 2 == 0 else "decode"
        group = copy.deepcopy(template[mode])
        group["nodes"] = addresses[index * GROUP_SIZE:(index + 1) * GROUP_SIZE]
        values["groups"][f"{mode}-{index // 2}"] = group
    values["mooncakeMaster"]["node"] = addresses[0]
    values["router"]["node"] = addresses[GROUP_SIZE]
    for node_file in values["nodeFiles"]:
        node_file.pop("sha256", None)  # with_local_files writes stand-in contents
    return with_local_files(values, directory)


def preview_once(nodes: int) -> dict[str, Any]:
    import pulumi
    from pulumi.runtime.config import set_all_config

    from tests.program.harness import ClusterMocks

    class CountingMocks(ClusterMocks):
        registered = 0

        def new_resource(self, args):
            CountingMocks.registered += 1
            return super().new_resource(args)

    rss_after_imports = high_water_mib()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        values = generated_values(nodes, Path(directory))
        set_all_config({f"kimipd:{key}": value if isinstance(value, str) else json.dumps(value)
                        for key, value in values.items()}
                       | {"kimipd:sshPrivateKey": "not-a-key", "kimipd:routerApiKey": "not-a-key"},
                       ["kimipd:sshPrivateKey", "kimipd:routerApiKey"])
        pulumi.runtime.set_mocks(CountingMocks(), project="kimipd", stack=f"bench-{nodes}",
                                 preview=True)

        @pulumi.runtime.test
        def program():
            module = runpy.run_path(str(REPO / "__main__.py"), run_name="__main__")
            return pulumi.Output.from_input(module["cluster"].outputs)

        program()
    wall = time.perf_counter() - started
    peak = high_water_mib()
    return {"nodes": nodes, "resources": CountingMocks.registered, "seconds": wall,
            "peak_rss_mib": peak, "program_rss_mib": peak - rss_after_imports}


def measure(sizes: list[int], runs: int) -> dict[int, list[dict[str, Any]]]:
    """Each size RUNS times, each in a fresh interpreter."""
    results: dict[int, list[dict[str, Any]]] = {}
    for size in sizes:
        for _ in range(runs):
            done = subprocess.run([sys.executable, "-m", "bench.program_cost", "--nodes",
                                   str(size)], cwd=REPO, capture_output=True, text=True,
                                  timeout=1800, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"preview of {size} nodes under mocks failed:\n"
                                   f"{done.stderr[-3000:]}")
            results.setdefault(size, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"bench: B4 {size} nodes: {min(r['seconds'] for r in results[size]):.2f}s, "
              f"{results[size][0]['resources']} resources", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    args = parser.parse_args()
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    print(json.dumps(preview_once(args.nodes)))


if __name__ == "__main__":
    main()
