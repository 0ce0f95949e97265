"""Print everything the renderers produce for every stack file in the repository, as JSON.

Run it on two commits and diff the outputs to show that a change of the code's layout changed
nothing that reaches a node: every container plan (argv, environment, labels, mounts), every
command run over SSH, the router's argv and the Prometheus targets.

    scripts/dump-renderings > before.json
    git checkout OTHER
    scripts/dump-renderings | diff before.json -
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from components import render
from components.config import load_cluster_config, read_stack_file

REPO = Path(__file__).resolve().parent.parent

# Stand-ins for values that only exist on a node (image ids, file digests): fixed, so the two
# dumps differ only where the code does.
BASE_IMAGE_ID = "sha256:" + "0" * 64
SCRIPT = "#!/bin/sh\ntrue\n"


def dump(stack_file: Path) -> dict[str, object]:
    cfg = load_cluster_config(read_stack_file(stack_file))
    stack = stack_file.stem.split(".", 1)[1]
    plans = [render.mooncake_master_plan(cfg), render.router_plan(cfg)]
    plans += [render.sglang_rank_plan(cfg, name, rank)
              for name, group in cfg.groups.items() for rank in range(len(group.nodes))]
    digests = {f.destination: "f" * 64 for f in cfg.node_files}
    tag = render.prepared_image_tag(cfg, BASE_IMAGE_ID, digests, {"launch.sh": SCRIPT})
    per_node = {
        node.address: {
            "preflight": render.preflight_command(cfg, node.address, SCRIPT),
            "imageEnvCheck": render.image_env_check_command(cfg, node.address, cfg.image, SCRIPT),
            "prepareImage": render.prepare_image_command(cfg, node.address, BASE_IMAGE_ID, tag,
                                                         stack, digests),
        }
        for node in cfg.nodes
    }
    return {
        "plans": [dataclasses.asdict(plan) for plan in plans],
        "waitHealthy": [render.wait_healthy_command(cfg, plan) for plan in plans],
        "waitBootstrap": [render.wait_bootstrap_command(cfg, name)
                          for name in cfg.groups_in_mode("prefill")],
        "sglangArgs": {name: [render.sglang_launch_args(cfg, name, rank)
                              for rank in range(len(group.nodes))]
                       for name, group in cfg.groups.items()},
        "routerCommand": render.router_command(cfg),
        "routerUrl": render.router_url(cfg),
        "groupEndpoints": {name: render.group_endpoint(group)
                           for name, group in cfg.groups.items()},
        "smokeTest": render.smoke_test_command(cfg),
        "prepareDirs": render.prepare_dirs_command(cfg),
        "preparedImageTag": tag,
        "dockerSshOpts": render.docker_ssh_opts(cfg),
        "mooncakeMasterAddress": render.mooncake_master_address(cfg),
        "variablesSetInEveryContainer": render.variables_set_in_every_container(cfg),
        "prometheusTargets": render.prometheus_targets(cfg, stack),
        "nodes": per_node,
    }


def main() -> None:
    stacks = sorted(REPO.glob("Pulumi.*.yaml"))
    json.dump({path.name: dump(path) for path in stacks}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
