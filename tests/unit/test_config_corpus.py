"""Every plausible operator mistake, refused at preview: a corpus of edits to the pro6000 stack.

Each bad case is an edit to a copy of Pulumi.pro6000.yaml's values, the key its refusal must
name, the value as the stack wrote it and a fragment of the fix. Each is checked twice: by the
model alone (or, for what lives outside it, shown to pass the model), and by the whole program
under Pulumi's mocks, which must raise pulumi.RunError before registering a single resource.
Every line of a refusal names the key the case touched (or a key listed in `also`): a mistake in
one place does not drag in rules the operator did not touch. The good cases are edits an operator
may well make, which must stay accepted by the model and by a full mocked run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from components.config import ConfigError, load_cluster_config, shown_value
from tests.conftest import stack_values
from tests.program.harness import PRIVATE_KEY, run_program, run_refused, with_local_files

pytestmark = pytest.mark.timeout(120)  # the SDK's threads can hang under mocks (pulumi#7663)

ABSENT = object()  # the mistake is a missing value (or a secret): no value to quote
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJfgKiWamXPTsd7uZhA6AgAZzUZsY6dG8SGay1UGWS5Q"
MOONCAKE_OLD = ("/data/wheels/mooncake_transfer_engine_cuda13-0.3.11.post1-cp312-cp312-"
                "manylinux_2_28_x86_64.whl")
Edit = Callable[[dict], Any]


def unchanged(values: dict) -> None:
    """The stack file's values stay as they are (the mistake is in how a key is set)."""


@dataclass(frozen=True)
class Bad:
    label: str
    edit: Edit
    key: str  # the key the refusal names
    written: Any  # the value as the stack wrote it (ABSENT: nothing to quote)
    fix: str  # a fragment of the fix the message gives
    also: tuple[str, ...] = ()  # other keys a line of the refusal may name
    outside_model: bool = False  # refused by the program's checks after the model (files, keys)
    run: dict[str, Any] = field(default_factory=dict)  # run_program options (secrets, raw keys)


# pro6000 runs the rust router with one group of each mode: its preview says that a change of
# either group leaves the router without that mode for a model load.
ONE_GROUP_EACH = ("groups.prefill: the only prefill group", "groups.decode: the only decode group")


@dataclass(frozen=True)
class Good:
    label: str
    edit: Edit
    warns: tuple[str, ...] = ONE_GROUP_EACH  # a fragment of each warning preview gives


def put(*path_and_value: Any) -> Edit:
    """Set values[path...] = value."""
    *path, value = path_and_value

    def edit(values: dict) -> None:
        target = values
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = copy.deepcopy(value)
    return edit


def drop(*path: Any) -> Edit:
    def edit(values: dict) -> None:
        target = values
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]
    return edit


def both(*edits: Edit) -> Edit:
    def edit(values: dict) -> None:
        for each in edits:
            each(values)
    return edit


def add_group(name: str, **group: Any) -> Edit:
    def edit(values: dict) -> None:
        values["groups"][name] = {**copy.deepcopy(values["groups"]["decode"]),
                                  "extraArgs": [], **group}
    return edit


def append(*path_and_item: Any) -> Edit:
    *path, item = path_and_item

    def edit(values: dict) -> None:
        target = values
        for part in path:
            target = target[part]
        target.append(copy.deepcopy(item))
    return edit


def rename_group(old: str, new: str) -> Edit:
    def edit(values: dict) -> None:
        values["groups"][new] = values["groups"].pop(old)
    return edit


DECODE_ARGS = ["--mem-fraction-static", "0.85"]
P, D = "prefill", "decode"

BAD = [
    # -- unknown keys: a typo is an error, with the key it was probably meant to be ------------
    Bad("misspelt router key", put("router", "prot", 31000), "router.prot", 31000,
        "did you mean 'port'"),
    Bad("misspelt top-level key", put("restartGen", 1), "restartGen", 1,
        "did you mean 'restartGeneration'"),
    Bad("wrong case in a group key", put("groups", D, "tpsize", 32), "groups.decode.tpsize", 32,
        "did you mean 'tpSize'"),
    Bad("snake_case key", put("mooncakeMaster", "rpc_port", 50051), "mooncakeMaster.rpc_port",
        50051, "did you mean 'rpcPort'"),
    Bad("misspelt node key", put("nodes", 0, "hostkey", ED25519), "nodes[0].hostkey", ED25519,
        "did you mean 'hostKey'"),
    Bad("singular ulimit key", put("container", "ulimit", {"memlock": -1}), "container.ulimit",
        {"memlock": -1}, "did you mean 'ulimits'"),
    Bad("singular rdma key", put("network", "rdmaDevice", ["mlx5_0"]), "network.rdmaDevice",
        ["mlx5_0"], "did you mean 'rdmaDevices'"),
    Bad("misspelt model key", put("model", "servedName", "kimi"), "model.servedName", "kimi",
        "did you mean 'servedModelName'"),
    Bad("misspelt preflight key", put("preflight", "checkGPUs", False), "preflight.checkGPUs",
        False, "did you mean 'checkGpus'"),
    Bad("misspelt node-file key", put("nodeFiles", 0, "dest", "/tmp/x.py"), "nodeFiles[0].dest",
        "/tmp/x.py", "did you mean 'destination'"),
    Bad("key from another tool", put("container", "runtime", "nvidia"), "container.runtime",
        "nvidia", "rename or remove it"),

    # -- required keys -------------------------------------------------------------------------
    Bad("no image", drop("image"), "image", ABSENT, "set it in the stack file"),
    Bad("no model", drop("model"), "model", ABSENT, "its keys: path, servedModelName, inImage"),
    Bad("no model path", drop("model", "path"), "model.path", ABSENT, "set it in the stack file"),
    Bad("no router", drop("router"), "router", ABSENT, "set it in the stack file"),
    Bad("no mooncake master", drop("mooncakeMaster"), "mooncakeMaster", ABSENT,
        "set it in the stack file"),
    Bad("no group mode", drop("groups", D, "mode"), "groups.decode.mode", ABSENT,
        "set it in the stack file"),
    Bad("no group tpSize", drop("groups", D, "tpSize"), "groups.decode.tpSize", ABSENT,
        "set it in the stack file"),
    Bad("no node address", put("nodes", 7, {"gpus": 8}), "nodes[7].address", ABSENT,
        "set it in the stack file"),
    Bad("no node-file source", drop("nodeFiles", 0, "source"), "nodeFiles[0].source", ABSENT,
        "set it in the stack file"),

    # -- wrong types: the expected type or choices, the value as written, the fix --------------
    Bad("tpSize in words", put("groups", D, "tpSize", "thirty-two"), "groups.decode.tpSize",
        "thirty-two", "write a plain integer"),
    Bad("tpSize with decimals", put("groups", D, "tpSize", 32.5), "groups.decode.tpSize", 32.5,
        "write a plain integer"),
    Bad("port with a unit", put("router", "port", "31000/tcp"), "router.port", "31000/tcp",
        "e.g. port: 31000"),
    Bad("serving maybe", put("serving", "maybe"), "serving", "maybe", "write true or false"),
    Bad("privileged sometimes", put("container", "privileged", "sometimes"),
        "container.privileged", "sometimes", "write true or false"),
    Bad("restartGeneration in words", put("restartGeneration", "next"), "restartGeneration",
        "next", "write a plain integer"),
    Bad("unquoted no for restart (YAML reads false)", put("container", "restart", False),
        "container.restart", False, "in quotes"),
    Bad("restart policy spelt with _", put("container", "restart", "on_failure"),
        "container.restart", "on_failure", "'on-failure'"),
    Bad("mode capitalised", put("groups", D, "mode", "Decode"), "groups.decode.mode", "Decode",
        "'prefill' or 'decode'"),
    Bad("router kind without dash", put("router", "kind", "minilb"), "router.kind", "minilb",
        "'mini-lb' or 'rust'"),
    Bad("router policy with dash", both(put("router", "kind", "rust"),
                                        put("router", "policy", "round-robin")),
        "router.policy", "round-robin", "'round_robin'"),
    Bad("env value a number", put("groups", D, "env", {"NCCL_DEBUG_SUBSYS": 1}),
        "groups.decode.env.NCCL_DEBUG_SUBSYS", 1, 'put it in quotes, "1"'),
    # `pulumi config set --path kimipd:container.env.X 26` stores the number 26.
    Bad("env value a number set with config set --path", put("container", "env", {"X": 26}),
        "container.env.X", 26, 'put it in quotes, "26"; from the CLI: '
        "pulumi config set --path --type string kimipd:container.env.X 26."),
    Bad("env value a YAML boolean", put("container", "env", {"HF_HUB_OFFLINE": True}),
        "container.env.HF_HUB_OFFLINE", True, "put the word in quotes"),
    Bad("env value true set with config set --path", put("container", "env", {"HF_HUB_OFFLINE": True}),
        "container.env.HF_HUB_OFFLINE", True,
        "pulumi config set --path --type string kimipd:container.env.HF_HUB_OFFLINE true."),
    Bad("extraArgs value unquoted", put("groups", D, "extraArgs", ["--mem-fraction-static", 0.85]),
        "groups.decode.extraArgs[1]", 0.85, 'put it in quotes, "0.85"'),
    # The key quoted for the shell: [1] is a glob.
    Bad("extraArgs value a number set with config set --path",
        put("groups", D, "extraArgs", ["--max-running-requests", 64]),
        "groups.decode.extraArgs[1]", 64,
        "pulumi config set --path --type string 'kimipd:groups.decode.extraArgs[1]' 64."),
    Bad("extraArgs one string", put("groups", D, "extraArgs", "--mem-fraction-static 0.85"),
        "groups.decode.extraArgs", "--mem-fraction-static 0.85", "write a YAML list"),
    Bad("nodes a single address", put("groups", D, "nodes", "174.1.60.5"), "groups.decode.nodes",
        "174.1.60.5", "[174.1.60.5]"),
    Bad("devices a single path", put("container", "devices", "/dev/infiniband"),
        "container.devices", "/dev/infiniband", "write a YAML list"),
    Bad("model a string", put("model", "/data/models/Kimi-K3"), "model", "/data/models/Kimi-K3",
        "path, servedModelName, inImage"),
    Bad("volumes a mapping", put("container", "volumes", {"hostPath": "/data/models",
                                                          "containerPath": "/data/models"}),
        "container.volumes", {"hostPath": "/data/models", "containerPath": "/data/models"},
        "write a YAML list"),
    Bad("smoke body a list", put("smokeTest", {"body": ["Hello"]}), "smokeTest.body", ["Hello"],
        "is not a mapping"),
    Bad("ulimit unlimited in words", put("container", "ulimits", {"memlock": "unlimited"}),
        "container.ulimits.memlock", "unlimited", "write a plain integer"),
    Bad("hostKey a number", put("nodes", 0, "hostKey", 25519), "nodes[0].hostKey", 25519,
        "put it in quotes"),
    Bad("ssh port 0", put("nodes", 0, "sshPort", 0), "nodes[0].sshPort", 0, "set it to 1 or more"),
    Bad("router port too high", put("router", "port", 70000), "router.port", 70000,
        "set it to 65535 or less"),
    Bad("http port negative", put("groups", D, "httpPort", -1), "groups.decode.httpPort", -1,
        "set it to 1 or more"),
    Bad("shm in GB", put("container", "shmSizeMb", 64 // 2), "container.shmSizeMb", 32,
        "set it to 64 or more"),
    Bad("node with negative GPUs", put("nodes", 7, "gpus", -8), "nodes[7].gpus", -8,
        "set it to 0 or more"),
    Bad("gate timeout 0", put("gates", "timeoutSeconds", 0), "gates.timeoutSeconds", 0,
        "set it to 1 or more"),
    Bad("gate interval beyond its timeout",
        both(put("gates", "timeoutSeconds", 30), put("gates", "intervalSeconds", 45)),
        "gates.intervalSeconds", 45, "set intervalSeconds to 30 or less"),
    Bad("dial limit 0", put("connection", "dialErrorLimit", 0), "connection.dialErrorLimit", 0,
        "set it to 1 or more"),
    Bad("negative disk floor", put("preflight", "minFreeDiskGb", -5), "preflight.minFreeDiskGb",
        -5, "set it to 0 or more"),
    Bad("no nodes", put("nodes", []), "nodes", [], "add one"),
    Bad("no groups", put("groups", {}), "groups", {}, "add one"),
    Bad("group with no nodes", put("groups", D, "nodes", []), "groups.decode.nodes", [],
        "add one"),

    # -- addresses and declared nodes ----------------------------------------------------------
    Bad("address with three parts", put("nodes", 0, "address", "174.1.60"), "nodes[0].address",
        "174.1.60", "e.g. 174.1.60.1"),
    Bad("address a host name", put("nodes", 0, "address", "node1"), "nodes[0].address", "node1",
        "compute-network address"),
    Bad("address out of range", put("nodes", 0, "address", "174.1.60.300"), "nodes[0].address",
        "174.1.60.300", "e.g. 174.1.60.1"),
    Bad("router on an undeclared node", put("router", "node", "174.1.60.9"), "router.node",
        "174.1.60.9", "add it to `nodes`"),
    Bad("mc-master on an undeclared node", put("mooncakeMaster", "node", "174.1.60.10"),
        "mooncakeMaster.node", "174.1.60.10", "add it to `nodes`"),
    Bad("rank on an undeclared node", put("groups", D, "nodes", 3, "174.1.60.18"),
        "groups.decode.nodes[3]", "174.1.60.18", "add it to `nodes`"),
    Bad("node declared twice", append("nodes", {"address": "174.1.60.8"}), "nodes[8].address",
        "174.1.60.8", "keep one entry per host"),

    # -- the shape of a group ------------------------------------------------------------------
    Bad("a node twice in a group", put("groups", D, "nodes", 3, "174.1.60.5"),
        "groups.decode.nodes[3]", "174.1.60.5", "each node once"),
    Bad("distInitHost not the first node", put("groups", P, "distInitHost", "174.1.60.2"),
        "groups.prefill.distInitHost", "174.1.60.2", "reorder `nodes` or remove distInitHost"),
    Bad("tpSize below the GPUs", put("groups", P, "tpSize", 16), "groups.prefill.tpSize", 16,
        "set tpSize to 32"),
    Bad("tpSize above the GPUs", put("groups", D, "tpSize", 64), "groups.decode.tpSize", 64,
        "set tpSize to 32"),
    Bad("epSize above tpSize", put("groups", D, "epSize", 64), "groups.decode.epSize", 64,
        "set epSize <= 32"),
    Bad("epSize not dividing tpSize", put("groups", D, "epSize", 12), "groups.decode.epSize", 12,
        "a divisor of 32"),
    Bad("epSize odd", put("groups", P, "epSize", 3), "groups.prefill.epSize", 3,
        "a divisor of 32"),
    Bad("dist-init range past 65535", put("groups", P, "distInitPort", 65530),
        "groups.prefill.distInitPort", 65530, "65528 or lower"),
    Bad("two decode groups on one node", add_group("decode2", nodes=["174.1.60.8"], tpSize=8,
                                                   epSize=8),
        "groups.decode2.nodes[0]", "174.1.60.8", "use another node"),
    Bad("no decode group", drop("groups", D), "groups", ABSENT, "add a group with `mode: decode`"),
    Bad("every group prefill", put("groups", D, "mode", "prefill"), "groups", ABSENT,
        "add a group with `mode: decode`"),
    Bad("group name with a space", rename_group(D, "decode A"), "groups", "decode A",
        "'decode-A'"),
    Bad("group name with a slash", rename_group(P, "prefill/1"), "groups", "prefill/1",
        "rename the group"),

    # -- GPUs claimed per node -----------------------------------------------------------------
    Bad("decode on a prefill node", put("groups", D, "nodes", 0, "174.1.60.1"),
        "groups.decode.nodes[0]", "174.1.60.1", "give each group nodes of its own"),
    Bad("prefill on a decode node", put("groups", P, "nodes", 3, "174.1.60.8"),
        "groups.decode.nodes[3]", "174.1.60.8", "give each group nodes of its own",
        also=("groups.prefill",)),
    Bad("a third group on a prefill node", add_group("decode-b", nodes=["174.1.60.2"], tpSize=8,
                                                     epSize=8),
        "groups.decode-b.nodes[0]", "174.1.60.2", "give each group nodes of its own"),
    Bad("a node with fewer GPUs", both(put("nodes", 3, "gpus", 4), put("groups", P, "tpSize", 28),
                                       put("groups", P, "epSize", 28)),
        "groups.prefill.nodes[3]", "174.1.60.4", "nodes with the same number of GPUs",
        also=("nodes[3].gpus",)),
    Bad("GPU counts that do not split evenly", both(put("nodes", 0, "gpus", 5),
                                                     put("groups", P, "tpSize", 29),
                                                     put("groups", P, "epSize", 29)),
        "groups.prefill.tpSize", 29, "same number of GPUs"),

    # -- runbook rule 1: expandable segments ---------------------------------------------------
    Bad("expandable segments in decode",
        put("groups", D, "env", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        "groups.decode.env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
        "remove expandable_segments:True"),
    Bad("expandable segments among others", put("groups", P, "env", {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512,expandable_segments:True"}),
        "groups.prefill.env.PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size_mb:512,expandable_segments:True", "remove expandable_segments:True"),
    Bad("expandable segments spaced",
        put("container", "env", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments : true"}),
        "container.env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments : true", "#2511"),
    Bad("expandable segments, newer variable",
        put("groups", D, "env", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}),
        "groups.decode.env.PYTORCH_ALLOC_CONF", "expandable_segments:True", "remove"),

    # -- runbook rule 4: NCCL/GLOO on the compute network --------------------------------------
    Bad("NCCL on bond0", put("network", "ncclSocketInterface", "bond0"),
        "network.ncclSocketInterface", "bond0", "set it to the compute interface"),
    Bad("GLOO on bond0", put("network", "glooSocketInterface", "bond0"),
        "network.glooSocketInterface", "bond0", "set it to the compute interface"),
    Bad("compute interface bond0", put("network", "computeInterface", "bond0"),
        "network.computeInterface", "bond0", "set it to the compute interface"),
    Bad("NCCL env on bond0", put("groups", P, "env", {"NCCL_SOCKET_IFNAME": "bond0"}),
        "groups.prefill.env.NCCL_SOCKET_IFNAME", "bond0", "remove it"),
    Bad("GLOO env listing bond0", put("groups", D, "env", {"GLOO_SOCKET_IFNAME": "bond1,bond0"}),
        "groups.decode.env.GLOO_SOCKET_IFNAME", "bond1,bond0", "remove it"),
    Bad("NCCL exact-match bond0", put("container", "env", {"NCCL_SOCKET_IFNAME": "=bond0"}),
        "container.env.NCCL_SOCKET_IFNAME", "=bond0", "remove it"),
    Bad("NCCL exclusion list", put("container", "env", {"NCCL_SOCKET_IFNAME": "^docker0,lo"}),
        "container.env.NCCL_SOCKET_IFNAME", "^docker0,lo", "exclusion list"),

    # -- runbook rule 5: no NIXL ---------------------------------------------------------------
    Bad("nixl", put("groups", D, "transferBackend", "nixl"), "groups.decode.transferBackend",
        "nixl", "use 'mooncake'"),
    Bad("NIXL in capitals", put("groups", P, "transferBackend", "NIXL"),
        "groups.prefill.transferBackend", "NIXL", "use 'mooncake'"),
    Bad("another backend", put("groups", P, "transferBackend", "ascend"),
        "groups.prefill.transferBackend", "ascend", "use 'mooncake'"),

    # -- extraArgs, as SGLang's and the router's own parsers read them -------------------------
    Bad("extraArgs re-sets tpSize",
        put("groups", D, "extraArgs", [*DECODE_ARGS, "--tp-size", "16"]),
        "groups.decode.extraArgs[2]", "--tp-size", "set groups.decode.tpSize"),
    Bad("extraArgs re-sets tp, = form", put("groups", D, "extraArgs", [*DECODE_ARGS, "--tp=16"]),
        "groups.decode.extraArgs[2]", "--tp=16", "set groups.decode.tpSize"),
    Bad("extraArgs re-sets the model", put("groups", P, "extraArgs", ["--model", "/other"]),
        "groups.prefill.extraArgs[0]", "--model", "set model.path"),
    Bad("extraArgs re-sets the port", put("groups", D, "extraArgs", ["--port", "30001"]),
        "groups.decode.extraArgs[0]", "--port", "set groups.decode.httpPort"),
    Bad("extraArgs binds loopback", put("groups", D, "extraArgs", ["--host=127.0.0.1"]),
        "groups.decode.extraArgs[0]", "--host=127.0.0.1", "every rank binds 0.0.0.0"),
    Bad("extraArgs selects nixl", put("groups", P, "extraArgs",
                                      ["--disaggregation-transfer-backend=nixl"]),
        "groups.prefill.extraArgs[0]", "--disaggregation-transfer-backend=nixl",
        "set groups.prefill.transferBackend"),
    Bad("extraArgs sets the IB devices", put("groups", P, "extraArgs",
                                             ["--disaggregation-ib-device", "mlx5_0"]),
        "groups.prefill.extraArgs[0]", "--disaggregation-ib-device", "set network.rdmaDevices"),
    Bad("unknown SGLang flag", put("groups", P, "extraArgs", ["--enable-ep-moe"]),
        "groups.prefill.extraArgs", ["--enable-ep-moe"], "fix the flag or its value"),
    Bad("bad SGLang choice", put("groups", P, "extraArgs", ["--kv-cache-dtype", "fp9"]),
        "groups.prefill.extraArgs", ["--kv-cache-dtype", "fp9"], "invalid choice"),
    Bad("bad SGLang int", put("groups", D, "extraArgs", ["--max-running-requests", "many"]),
        "groups.decode.extraArgs", ["--max-running-requests", "many"], "fix the flag or its value"),
    Bad("ambiguous SGLang abbreviation", put("groups", D, "extraArgs", ["--disable"]),
        "groups.decode.extraArgs", ["--disable"], "ambiguous option"),
    Bad("SGLang flag without its value", put("groups", P, "extraArgs", ["--chunked-prefill-size"]),
        "groups.prefill.extraArgs", ["--chunked-prefill-size"], "expected one argument"),
    Bad("router extraArgs re-sets the port", put("router", "extraArgs", ["--port", "31001"]),
        "router.extraArgs[0]", "--port", "set router.port"),
    Bad("router extraArgs abbreviates policy", put("router", "extraArgs", ["--polic", "random"]),
        "router.extraArgs[0]", "--polic", "set router.policy"),
    Bad("unknown router flag", put("router", "extraArgs", ["--pd-mode"]), "router.extraArgs",
        ["--pd-mode"], "fix the flag or its value"),

    # -- runbook rule 3: Mooncake >= 0.3.12.post1, one wheel -----------------------------------
    Bad("old Mooncake wheel", put("nodeFiles", 2, {"source": MOONCAKE_OLD,
                                                   "destination": MOONCAKE_OLD}),
        "nodeFiles[2].destination", MOONCAKE_OLD, "ship the 0.3.12.post1 wheel or newer"),
    Bad("two Mooncake wheels", append("nodeFiles", {
        "source": "/tmp/mooncake_transfer_engine-0.3.13-cp312-cp312-linux_x86_64.whl",
        "destination": "/tmp/mooncake_transfer_engine-0.3.13-cp312-cp312-linux_x86_64.whl"}),
        "nodeFiles", ABSENT, "keep one"),
    Bad("no Mooncake wheel, image version unknown", drop("nodeFiles", 2), "nodeFiles", ABSENT,
        "declare imageMooncakeVersion"),
    Bad("no Mooncake wheel, image version too old",
        both(drop("nodeFiles", 2), put("imageMooncakeVersion", "0.3.11.post1")),
        "imageMooncakeVersion", "0.3.11.post1", "add the 0.3.12.post1 wheel"),
    Bad("image Mooncake version malformed",
        both(drop("nodeFiles", 2), put("imageMooncakeVersion", "0.3.12-post1")),
        "imageMooncakeVersion", "0.3.12-post1", "e.g. 0.3.12.post1"),
    Bad("Mooncake wheel without a version", put("nodeFiles", 2, {
        "source": "/tmp/mooncake_transfer_engine.whl",
        "destination": "/tmp/mooncake_transfer_engine.whl"}),
        "nodeFiles[2].destination", "/tmp/mooncake_transfer_engine.whl",
        "name the wheel as pip built it"),

    # -- the router ----------------------------------------------------------------------------
    Bad("a policy MiniLB ignores", both(put("router", "kind", "mini-lb"),
                                        put("router", "policy", "cache_aware")),
        "router.policy", "cache_aware", "set router.kind to 'rust'"),
    Bad("a policy MiniLB ignores (round robin)", both(put("router", "kind", "mini-lb"),
                                                      put("router", "policy", "round_robin")),
        "router.policy", "round_robin", "set router.kind to 'rust'"),
    Bad("an admin key beside the router's", put("groups", "prefill", "extraArgs",
                                                ["--admin-api-key", "x"]),
        "groups.prefill.extraArgs[0]", "--admin-api-key", "the secret adminApiKey"),
    Bad("several tokenizer workers with keyed servers",
        put("groups", "decode", "extraArgs", ["--tokenizer-worker-num", "2"]),
        "groups.decode.extraArgs[0]", "--tokenizer-worker-num", "--tokenizer-worker-num 1"),
    Bad("a serving port opened to anyone", put("firewall", "openPorts", [9100, 30000]),
        "firewall.openPorts[1]", 30000, "firewall.clientNetworks"),
    Bad("a client network that is no network", put("firewall", "clientNetworks", ["10.0.0/8"]),
        "firewall.clientNetworks", "10.0.0/8", "174.1.60.0/24"),

    # -- ports on one node (host networking) ---------------------------------------------------
    Bad("router on decode rank 0's port", put("router", "port", 30000), "router.port", 30000,
        "choose another port"),
    Bad("router on a rank >= 1's port", both(put("router", "node", "174.1.60.6"),
                                             put("router", "door", "nodes",
                                                 ["174.1.60.6", "174.1.60.7"]),
                                             put("router", "port", 30000)),
        "router.port", 30000, "choose another port"),
    Bad("mc-master inside the dist-init range", put("mooncakeMaster", "rpcPort", 20003),
        "mooncakeMaster.rpcPort", 20003, "choose another port", also=("groups.prefill",)),
    Bad("mc-master metrics on its RPC port", put("mooncakeMaster", "metricsPort", 50051),
        "mooncakeMaster.metricsPort", 50051, "choose another port"),
    Bad("bootstrap on the HTTP port", put("groups", P, "bootstrapPort", 30000),
        "groups.prefill.bootstrapPort", 30000, "choose another port"),
    Bad("decode HTTP on the router's port", put("groups", D, "httpPort", 31000),
        "groups.decode.httpPort", 31000, "choose another port", also=("router.port",)),

    # -- node files ----------------------------------------------------------------------------
    Bad("relative destination", put("nodeFiles", 0, "destination", "tmp/patch_k3_sm120.py"),
        "nodeFiles[0].destination", "tmp/patch_k3_sm120.py", "write the full path"),
    Bad("directory destination", put("nodeFiles", 0, "destination", "/tmp/"),
        "nodeFiles[0].destination", "/tmp/", "add the file name"),
    Bad("root destination", put("nodeFiles", 1, "destination", "/"), "nodeFiles[1].destination",
        "/", "add the file name"),
    Bad("dot destination", put("nodeFiles", 0, "destination", "/tmp/."),
        "nodeFiles[0].destination", "/tmp/.", "add the file name"),
    Bad("a destination twice", put("nodeFiles", 1, "destination", "/tmp/patch_k3_sm120.py"),
        "nodeFiles[1].destination", "/tmp/patch_k3_sm120.py", "its own destination"),
    Bad("sha256 in capitals", put("nodeFiles", 0, "sha256", "AB" * 32), "nodeFiles[0].sha256",
        "AB" * 32, "sha256sum"),
    Bad("sha256 truncated", put("nodeFiles", 0, "sha256", "7226f882599bda4d"),
        "nodeFiles[0].sha256", "7226f882599bda4d", "sha256sum"),

    # -- the image -----------------------------------------------------------------------------
    Bad("empty image", put("image", ""), "image", "", "e.g. lmsysorg/sglang:kimi-k3"),
    Bad("blank image", put("image", "  "), "image", "  ", "e.g. lmsysorg/sglang:kimi-k3"),
    Bad("image with an empty tag", put("image", "lmsysorg/sglang:"), "image", "lmsysorg/sglang:",
        "REPOSITORY[:TAG]"),
    Bad("image with a space", put("image", "lmsysorg/sglang :kimi-k3"), "image",
        "lmsysorg/sglang :kimi-k3", "REPOSITORY[:TAG]"),
    Bad("image in capitals", put("image", "LMSYSorg/sglang:kimi-k3"), "image",
        "LMSYSorg/sglang:kimi-k3", "in lower case"),
    Bad("image with a short digest", put("image", "lmsysorg/sglang:kimi-k3@sha256:abc"), "image",
        "lmsysorg/sglang:kimi-k3@sha256:abc", "@sha256:DIGEST"),
    Bad("image as a URL", put("image", "https://docker.io/lmsysorg/sglang:kimi-k3"), "image",
        "https://docker.io/lmsysorg/sglang:kimi-k3", "REPOSITORY[:TAG]"),
    Bad("image with two tags", put("image", "lmsysorg/sglang:kimi:k3"), "image",
        "lmsysorg/sglang:kimi:k3", "REPOSITORY[:TAG]"),
    Bad("image with an empty path part", put("image", "lmsysorg//sglang:kimi-k3"), "image",
        "lmsysorg//sglang:kimi-k3", "REPOSITORY[:TAG]"),

    # -- the model -----------------------------------------------------------------------------
    Bad("model path relative", put("model", "path", "Kimi-K3"), "model.path", "Kimi-K3",
        "write the full path"),
    Bad("model path a hub id", put("model", "path", "moonshotai/Kimi-K3"), "model.path",
        "moonshotai/Kimi-K3", "Hugging Face hub id"),
    Bad("model path with ~", put("model", "path", "~/models/Kimi-K3"), "model.path",
        "~/models/Kimi-K3", "write the full path"),
    Bad("model outside every volume", put("model", "path", "/models/Kimi-K3"), "model.path",
        "/models/Kimi-K3", "set model.inImage: true"),
    Bad("model in a sibling of the volume", put("model", "path", "/data/models-old/Kimi-K3"),
        "model.path", "/data/models-old/Kimi-K3", "mount the directory that holds it"),
    Bad("model volume removed", put("container", "volumes", []), "model.path",
        "/data/models/Kimi-K3", "mount the directory that holds it"),

    # -- RDMA devices --------------------------------------------------------------------------
    Bad("no RDMA devices", put("network", "rdmaDevices", []), "network.rdmaDevices", [],
        "list the compute network's RDMA devices"),
    Bad("an empty RDMA device", put("network", "rdmaDevices", ["mlx5_0", ""]),
        "network.rdmaDevices", "", "list the compute network's RDMA devices"),
    Bad("RDMA devices in one string", put("network", "rdmaDevices", ["mlx5_0,mlx5_1"]),
        "network.rdmaDevices", "mlx5_0,mlx5_1", "not one device name"),

    # -- docker's vocabulary: ulimits, capabilities, paths -------------------------------------
    Bad("misspelt ulimit", put("container", "ulimits", {"memlok": -1, "stack": 67108864}),
        "container.ulimits", "memlok", "did you mean 'memlock'"),
    Bad("ulimit in capitals", put("container", "ulimits", {"MEMLOCK": -1}), "container.ulimits",
        "MEMLOCK", "did you mean 'memlock'"),
    Bad("ulimit in plural", put("container", "ulimits", {"memlock": -1, "nofiles": 65536}),
        "container.ulimits", "nofiles", "did you mean 'nofile'"),
    Bad("misspelt capability", put("container", "capabilities", ["IPC_LOK"]),
        "container.capabilities", "IPC_LOK", "did you mean 'IPC_LOCK'"),
    Bad("misspelt capability with CAP_", put("container", "capabilities", ["CAP_SYS_NIC"]),
        "container.capabilities", "CAP_SYS_NIC", "did you mean 'SYS_NICE'"),
    Bad("relative host path", put("container", "volumes", 0, "hostPath", "models"),
        "container.volumes[0].hostPath", "models", "named volume"),
    Bad("relative container path", put("container", "volumes", 0, "containerPath", "data/models"),
        "container.volumes[0].containerPath", "data/models", "write the full path"),
    Bad("volume on /", put("container", "volumes", 0, "containerPath", "/"),
        "container.volumes[0].containerPath", "/", "mount on a directory below /"),
    Bad("two volumes on one mount point", append("container", "volumes", {
        "hostPath": "/mnt/nvme/models", "containerPath": "/data/models/"}),
        "container.volumes[1].containerPath", "/data/models/", "mount it elsewhere"),
    Bad("a volume on a node file", append("container", "volumes", {
        "hostPath": "/srv/patch.py", "containerPath": "/tmp/patch_k3_sm120.py"}),
        "container.volumes[1].containerPath", "/tmp/patch_k3_sm120.py", "mount it elsewhere"),
    Bad("relative device", put("container", "devices", ["infiniband"]), "container.devices",
        "infiniband", "e.g. /dev/infiniband"),
    Bad("relative disk path", put("preflight", "diskPath", "var/lib/docker"),
        "preflight.diskPath", "var/lib/docker", "e.g. /var/lib/docker"),

    # -- host keys -----------------------------------------------------------------------------
    Bad("host key as a SHA256 fingerprint",
        put("nodes", 0, "hostKey", "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"),
        "nodes[0].hostKey", "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s",
        "ssh-keyscan -t ed25519"),
    Bad("host key as an MD5 fingerprint",
        put("nodes", 1, "hostKey", "MD5:16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48"),
        "nodes[1].hostKey", "MD5:16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48",
        "TYPE BASE64"),
    Bad("host key as a known_hosts line", put("nodes", 2, "hostKey", "174.1.60.3 " + ED25519),
        "nodes[2].hostKey", "174.1.60.3 " + ED25519, "TYPE BASE64"),
    Bad("host key without its type", put("nodes", 3, "hostKey", ED25519.split()[1]),
        "nodes[3].hostKey", ED25519.split()[1], "TYPE BASE64"),
    Bad("host key type only", put("nodes", 3, "hostKey", "ssh-ed25519"), "nodes[3].hostKey",
        "ssh-ed25519", "TYPE BASE64"),
    Bad("host key under the wrong type", put("nodes", 4, "hostKey",
                                             "ssh-rsa " + ED25519.split()[1]),
        "nodes[4].hostKey", "ssh-rsa " + ED25519.split()[1], "ssh-keyscan"),
    Bad("host key not base64", put("nodes", 5, "hostKey", "ssh-ed25519 not-base64!"),
        "nodes[5].hostKey", "ssh-ed25519 not-base64!", "TYPE BASE64"),

    # -- restart policy ------------------------------------------------------------------------
    Bad("restart always", put("container", "restart", "always"), "container.restart", "always",
        "set it to 'no'"),
    Bad("restart unless-stopped", put("container", "restart", "unless-stopped"),
        "container.restart", "unless-stopped", "set it to 'no'"),
    Bad("restart on-failure", put("container", "restart", "on-failure"), "container.restart",
        "on-failure", "`pulumi refresh` then `pulumi up`"),

    # -- outside the model: files and keys on the machine running Pulumi, secrets --------------
    Bad("node file missing here", put("nodeFiles", 0, "source", "/nonexistent/patch_k3_sm120.py"),
        "nodeFiles[0].source", "/nonexistent/patch_k3_sm120.py", "copy the file here",
        outside_model=True),
    Bad("node file with another checksum", put("nodeFiles", 0, "sha256", "0" * 64),
        "nodeFiles[0].sha256", "0" * 64, "update sha256", also=("nodeFiles[0].source",),
        outside_model=True),
    Bad("known_hosts file missing", put("connection", "knownHostsFile", "/nonexistent/known_hosts"),
        "connection.knownHostsFile", "/nonexistent/known_hosts", "ssh-keyscan",
        outside_model=True),
    Bad("a node without a host key", append("nodes", {"address": "174.1.60.9", "gpus": 0}),
        "nodes[8]", "174.1.60.9", "ssh-keyscan -t ed25519 174.1.60.9", outside_model=True),
    Bad("SSH key in plain text", unchanged, "sshPrivateKey", ABSENT,
        "pulumi config set --secret sshPrivateKey < KEYFILE", outside_model=True,
        run={"private_key_secret": False}),
    Bad("SSH key under a misspelt secret", unchanged, "sshPrivatekey", ABSENT,
        "did you mean 'sshPrivateKey'", outside_model=True,
        run={"private_key": None, "extra_secrets": {"kimipd:sshPrivatekey": PRIVATE_KEY}}),
    Bad("a plain key set as a secret", unchanged, "serving", ABSENT, "without --secret",
        outside_model=True, run={"extra_secrets": {"kimipd:serving": "false"}}),
]

GOOD = [
    Good("pro6000 as written", unchanged),
    Good("gate interval as long as its timeout",
         both(put("gates", "timeoutSeconds", 30), put("gates", "intervalSeconds", 30))),
    Good("rust router, round robin", put("router", "policy", "round_robin")),
    Good("MiniLB, as the runbook ran", put("router", "kind", "mini-lb"),
         warns=("router.kind: 'mini-lb' takes no key at the door",)),
    Good("no firewall (the nodes behind one of their own)", put("firewall", "enabled", False),
         warns=(*ONE_GROUP_EACH, "firewall.enabled: false leaves every port",
                "firewall.enabled: false lets VRRP from anyone")),
    Good("clients from one network, Prometheus from a host",
         both(put("firewall", "clientNetworks", ["10.20.0.0/16", "fd00::/8"]),
              put("firewall", "monitoringHosts", ["174.1.60.200"]),
              put("firewall", "openPorts", [9100]))),
    Good("model carried by the image", both(put("container", "volumes", []),
                                            put("model", "inImage", True))),
    Good("model on its own volume", put("container", "volumes", [
        {"hostPath": "/mnt/weights/K3", "containerPath": "/data/models/Kimi-K3/"}])),
    Good("model path with a trailing slash", put("model", "path", "/data/models/Kimi-K3/")),
    Good("a pinned ed25519 host key", put("nodes", 0, "hostKey", ED25519)),
    Good("image by registry, port and digest",
         put("image", "10.0.0.1:5000/kimipd/sglang:kimi-k3@sha256:" + "a" * 64)),
    Good("image on localhost without a tag", put("image", "localhost/sglang")),
    Good("more ulimits", put("container", "ulimits", {"memlock": -1, "stack": 67108864,
                                                      "nofile": 1048576})),
    Good("capabilities with CAP_", put("container", "capabilities", ["CAP_IPC_LOCK", "SYS_NICE"])),
    Good("epSize a smaller divisor", put("groups", D, "epSize", 8)),
    Good("other ports and a GID index", both(put("groups", D, "httpPort", 30001),
                                             put("network", "ibGidIndex", 3))),
    Good("single-node groups may restart", both(
        put("groups", P, "nodes", ["174.1.60.1"]), put("groups", P, "tpSize", 8),
        put("groups", P, "epSize", 8), put("groups", D, "nodes", ["174.1.60.5"]),
        put("groups", D, "tpSize", 8), put("groups", D, "epSize", 8),
        put("container", "restart", "on-failure"))),
    Good("a GPU-less router node", both(append("nodes", {"address": "174.1.60.9", "gpus": 0}),
                                        put("router", "node", "174.1.60.9"),
                                        put("router", "door", "nodes",
                                            ["174.1.60.9", "174.1.60.7"]))),
    Good("two RDMA devices", put("network", "rdmaDevices", ["mlx5_0", "mlx5_1"])),
    Good("a second decode group on its own node", both(
        append("nodes", {"address": "174.1.60.9"}),
        add_group("decode2", nodes=["174.1.60.9"], tpSize=8, epSize=8)),
         warns=ONE_GROUP_EACH[:1]),
]

# The corpus is meant to stay this large: a new rule brings its cases with it.
assert len(BAD) >= 100 and len(GOOD) >= 10, (len(BAD), len(GOOD))


@pytest.fixture(scope="module")
def local_values(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """pro6000 with its node files and known_hosts made on this machine, so a mocked run gets
    past the checks outside the model."""
    return with_local_files(stack_values("pro6000"), tmp_path_factory.mktemp("pro6000"))


def problems(message: str) -> list[str]:
    """The refusal's lines, without the `invalid kimipd ...:` headers."""
    return [line.strip() for line in message.splitlines() if line.startswith("  ")]


def check_refusal(case: Bad, message: str) -> None:
    lines = problems(message)
    assert lines, message
    shown = None if case.written is ABSENT else shown_value(case.written)
    naming = [line for line in lines if case.key in line and (shown is None or shown in line)]
    assert naming, f"no line names {case.key} with {shown}:\n{message}"
    assert any(case.fix in line for line in naming), f"no fix {case.fix!r}:\n{message}"
    for line in lines:
        assert any(key in line for key in (case.key, *case.also)), (
            f"a line about something {case.label!r} did not touch:\n{line}")
    assert "PRIVATE KEY" not in message and "TEST-KEY-NOT-REAL" not in message


@pytest.mark.parametrize("case", BAD, ids=lambda case: case.label)
def test_a_mistake_is_refused_before_any_resource(case: Bad, local_values: dict) -> None:
    values = copy.deepcopy(local_values)
    case.edit(values)
    if case.outside_model:
        load_cluster_config(values)  # the model has no say: the program's later checks refuse
    else:
        with pytest.raises(ConfigError) as error:
            load_cluster_config(values)
        check_refusal(case, str(error.value))
    message, run = run_refused(values, **case.run)
    check_refusal(case, message)
    assert run.resources == [], [r.name for r in run.resources]


@pytest.mark.parametrize("case", GOOD, ids=lambda case: case.label)
def test_a_legitimate_edit_is_accepted(case: Good, tmp_path: Path) -> None:
    values = copy.deepcopy(stack_values("pro6000"))
    case.edit(values)
    load_cluster_config(values)
    run = run_program(with_local_files(values, tmp_path))
    assert run.of_type("docker:index/container:Container"), "no container registered"
    assert len(run.warnings) == len(case.warns), run.warnings
    for fragment, warning in zip(case.warns, run.warnings):
        assert fragment in warning, warning
