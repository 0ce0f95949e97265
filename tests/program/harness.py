"""Runs the real `__main__.py` under Pulumi's mocks and records every registration."""

from __future__ import annotations

import hashlib
import json
import logging
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks, rpc
from pulumi.runtime.config import set_all_config

from components.config.placeholders import is_placeholder
from tests.conftest import REPO

SIG_KEY, SECRET_SIG = rpc._special_sig_key, rpc._special_secret_sig  # pylint: disable=protected-access
PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nTEST-KEY-NOT-REAL\n-----END OPENSSH PRIVATE KEY-----"
ROUTER_API_KEY = "test-router-api-key-not-real"
# What scripts/build-keepalived-image would print, in place of pro6000's placeholder.
KEEPALIVED_IMAGE = "registry.example/kimipd/keepalived@sha256:" + "b" * 64


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent: str
    dependencies: list[str]
    provider: str
    inputs: dict[str, Any]
    raw_inputs: dict[str, Any]
    replace_on_changes: list[str] = field(default_factory=list)
    replace_with: list[str] = field(default_factory=list)  # URNs
    delete_before_replace: bool = False
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)  # input -> URNs


@dataclass
class Run:
    resources: list[Registration] = field(default_factory=list)
    stack_outputs: dict[str, Any] = field(default_factory=dict)
    stack_outputs_secret: bool = False
    warnings: list[str] = field(default_factory=list)  # what pulumi.log.warn said

    def of_type(self, type_: str) -> list[Registration]:
        return [r for r in self.resources if r.type == type_]

    def named(self, name: str) -> Registration:
        matches = [r for r in self.resources if r.name == name]
        assert len(matches) == 1, f"expected one resource named {name!r}, found {len(matches)}"
        return matches[0]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.resources if r.urn == urn)

    def children(self, parent: Registration) -> list[Registration]:
        return [r for r in self.resources if r.parent == parent.urn]

    def descendants(self, root: Registration) -> list[Registration]:
        found, frontier = [], [root]
        while frontier:
            for child in self.children(frontier.pop()):
                found.append(child)
                frontier.append(child)
        return found

    def waits_for(self, later: Registration, earlier: Registration) -> bool:
        """Some part of `later` lists `earlier` (or, for a component, a part of it) as a dependency."""
        targets = {r.urn for r in [earlier, *self.descendants(earlier)]}
        dependencies = {d for r in [later, *self.descendants(later)] for d in r.dependencies}
        return bool(targets & dependencies)

    def containers(self) -> dict[str, Registration]:
        """By role (the kimipd.role label): rank containers are named by node and mode."""
        return {role_of(r): r for r in self.of_type("docker:index/container:Container")}


def role_of(container: Registration) -> str:
    return next(label["value"] for label in container.inputs["labels"]
                if label["label"] == "kimipd.role")


# How long every rank's gate says it took to serve.
MOCK_LOAD_SECONDS = 300


class ClusterMocks(pulumi.runtime.Mocks):
    """Provider answers shaped like the real ones: image ids, digests, a router answer."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        if args.typ == "docker:index/remoteImage:RemoteImage":
            digest = hashlib.sha256(args.inputs["name"].encode()).hexdigest()
            state |= {"imageId": f"sha256:{digest}", "repoDigest": f"{args.inputs['name']}@sha256:{digest}"}
        if args.typ == "command:remote:Command" and args.name == "smoke-test-generate":
            state["stdout"] = json.dumps({"text": " from the decode server", "meta_info": {}})
        if args.typ == "command:remote:Command" and args.name.endswith("-health"):
            # What wait-healthy.sh prints once the rank serves.
            state["stdout"] = (f"kimipd-{args.name.removesuffix('-health')}: healthy after "
                               f"{MOCK_LOAD_SECONDS}s (http://node/health)")
        if args.typ == "command:remote:Command" and args.name.endswith("-prepared-image"):
            # What prepare-image.sh prints last: the id of an image named by its inputs.
            digest = hashlib.sha256(args.inputs["create"].encode()).hexdigest()
            state["stdout"] = f"building\nsha256:{digest}"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class RecordingMonitor(mocks.MockMonitor):
    def __init__(self, run: Run) -> None:
        super().__init__(ClusterMocks())
        self.run = run

    def RegisterResource(self, request):  # noqa: N802 (gRPC name)
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.run.resources.append(Registration(
                type=request.type, name=request.name, urn=response.urn, parent=request.parent,
                dependencies=list(request.dependencies), provider=request.provider,
                inputs=self.resources[response.urn].state if response.urn in self.resources else {},
                raw_inputs=json_format.MessageToDict(request.object),
                replace_on_changes=list(request.replaceOnChanges),
                replace_with=list(request.replace_with),
                delete_before_replace=request.deleteBeforeReplace,
                property_dependencies={key: list(deps.urns) for key, deps
                                       in request.propertyDependencies.items()}))
        return response


def host_key_of(address: str) -> str:
    """A made-up ed25519 public key per address (the mocks never dial)."""
    return "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + hashlib.sha256(address.encode()).hexdigest()[:43]


def with_local_files(values: dict, directory: Path) -> dict:
    """Point nodeFiles' sources and the known_hosts file at files made for the test, and a
    placeholder keepalived image (pro6000's) at a built one's reference, as an operator does."""
    virtual_ip = ((values.get("router") or {}).get("door") or {}).get("virtualIp")
    if virtual_ip is not None and is_placeholder(virtual_ip.get("image", "")):
        virtual_ip["image"] = KEEPALIVED_IMAGE
    for node_file in values.get("nodeFiles", []):
        source = directory / Path(node_file["destination"]).name
        source.write_bytes(b"content of " + source.name.encode())
        node_file["source"] = str(source)
    known_hosts = directory / "known_hosts"
    known_hosts.write_text("".join(f"{n['address']} {host_key_of(n['address'])}\n"
                                   for n in values["nodes"]))
    values.setdefault("connection", {})["knownHostsFile"] = str(known_hosts)
    return values


class _Warnings(logging.Handler):
    def __init__(self, run: Run) -> None:
        super().__init__(logging.WARNING)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        self.run.warnings.append(record.getMessage())


def run_program(values: dict[str, Any], *, private_key: str | None = PRIVATE_KEY,
                private_key_secret: bool = True, router_api_key: str | None = ROUTER_API_KEY,
                extra_config: dict[str, str] | None = None,
                extra_secrets: dict[str, str] | None = None, run: Run | None = None) -> Run:
    """Run __main__.py with these `kimipd:*` values, as `pulumi up` would (not a preview).

    extra_config / extra_secrets: more keys, written in full (`namespace:name`) as the stack
    file would hold them. RUN collects the registrations even when the program raises.
    """
    run = Run() if run is None else run
    config = {f"kimipd:{key}": value if isinstance(value, str) else json.dumps(value)
              for key, value in values.items()}
    secret_keys = []
    if private_key is not None:
        config["kimipd:sshPrivateKey"] = private_key
        if private_key_secret:
            secret_keys.append("kimipd:sshPrivateKey")
    if router_api_key is not None:
        config["kimipd:routerApiKey"] = router_api_key
        secret_keys.append("kimipd:routerApiKey")
    config |= extra_config or {}
    config |= extra_secrets or {}
    secret_keys += list(extra_secrets or {})
    set_all_config(config, secret_keys)
    logger = logging.getLogger("kimipd-test-program")
    logger.propagate = False
    logger.handlers = [_Warnings(run)]
    pulumi.runtime.set_mocks(ClusterMocks(), project="kimipd", stack="test", preview=False,
                             logger=logger, monitor=RecordingMonitor(run))

    @pulumi.runtime.test
    def program():
        module = runpy.run_path(str(REPO / "__main__.py"), run_name="__main__")
        # What `pulumi.export` received, resolved.
        exported = pulumi.Output.from_input(module["cluster"].outputs)

        def record(values: tuple[dict, bool]) -> None:
            run.stack_outputs, run.stack_outputs_secret = values

        return pulumi.Output.all(exported, exported.is_secret()).apply(record)

    program()
    return run


def run_refused(values: dict[str, Any], **kwargs: Any) -> tuple[str, Run]:
    """Run __main__.py expecting a refusal: the pulumi.RunError's text and what got registered."""
    run = Run()
    try:
        run_program(values, run=run, **kwargs)
    except pulumi.RunError as error:
        return str(error), run
    raise AssertionError(f"the program accepted the stack ({len(run.resources)} resources)")
