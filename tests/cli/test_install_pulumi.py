"""scripts/install-pulumi from the official release files an air-gapped operator carries
(docs/air-gapped.md): the CLI tarball and the two plugin tarballs in the drop-in directory,
checked against SHA256SUMS.

The tarballs are fabricated here, in the official layout, from the binaries this machine's
install already holds (the CLI and language host beside it, the plugins in its PULUMI_HOME);
each test installs into a fresh KIMIPD_CACHE with the network probe and the Go build switched off,
so only the drop-in can satisfy it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(600)

INSTALL = REPO / "scripts" / "install-pulumi"
PLUGINS = {"command": "1.2.1", "docker": "5.2.0"}
LANGUAGE_HOST = ("pulumi-language-python", "pulumi-language-python-exec")
# Not this machine's `pulumi` (a sourced env file): step 1 would take it.
BARE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def installed_env_file() -> Path:
    cache = Path(os.environ.get("KIMIPD_CACHE", Path.home() / ".cache" / "kimipd"))
    return Path(os.environ.get("KIMIPD_PULUMI_ENV", cache / "pulumi" / "env"))


def sourced(env_file: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {env_file} && {command}"], capture_output=True,
                          text=True, env={"PATH": BARE_PATH, "HOME": os.environ["HOME"]},
                          timeout=120, check=False)


@dataclass(frozen=True)
class Release:
    """The official release files, fabricated: name -> path."""

    cli_version: str
    files: dict[str, Path]

    @property
    def cli_tarball(self) -> str:
        return f"pulumi-v{self.cli_version}-linux-x64.tar.gz"

    @staticmethod
    def plugin_tarball(name: str) -> str:
        return f"pulumi-resource-{name}-v{PLUGINS[name]}-linux-amd64.tar.gz"

    def dropin(self, directory: Path, names: list[str] | None = None,
               sums: dict[str, str] | None = None) -> Path:
        """A drop-in directory holding NAMES (default: all), and SHA256SUMS when SUMS is given."""
        directory.mkdir(parents=True, exist_ok=True)
        for name in names if names is not None else list(self.files):
            os.link(self.files[name], directory / name)
        if sums is not None:
            (directory / "SHA256SUMS").write_text("".join(f"{digest}  {name}\n"
                                                          for name, digest in sums.items()))
        return directory

    def sums(self) -> dict[str, str]:
        return {name: hashlib.sha256(path.read_bytes()).hexdigest()
                for name, path in self.files.items()}


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Release:
    env_file = installed_env_file()
    if not env_file.exists():
        pytest.skip(f"{env_file} missing: no installed Pulumi CLI to fabricate the release from")
    found = sourced(env_file, 'command -v pulumi && echo "$PULUMI_HOME"')
    if found.returncode != 0:
        pytest.skip(f"{env_file} names no pulumi CLI")
    cli, pulumi_home = found.stdout.split()
    bin_dir = Path(cli).parent
    sources = {name: bin_dir / name for name in ("pulumi", *LANGUAGE_HOST)}
    sources |= {f"pulumi-resource-{name}": Path(pulumi_home) / "plugins" / f"resource-{name}-v{version}"
                / f"pulumi-resource-{name}" for name, version in PLUGINS.items()}
    for path in sources.values():
        if not path.exists():
            pytest.skip(f"{path} missing: cannot fabricate the release tarballs")
    version = subprocess.run([cli, "version"], capture_output=True, text=True, check=True,
                             env={"PATH": BARE_PATH, "PULUMI_HOME": pulumi_home},
                             timeout=120).stdout.strip()
    version = version.removeprefix("v")
    out = tmp_path_factory.mktemp("release")

    def tarball(name: str, members: dict[str, Path]) -> Path:
        path = out / name
        with tarfile.open(path, "w:gz", compresslevel=1) as archive:
            for arcname, source in members.items():
                archive.add(source, arcname=arcname)
        return path

    release = Release(version, {})
    release.files[release.cli_tarball] = tarball(
        release.cli_tarball, {f"pulumi/{name}": sources[name] for name in ("pulumi", *LANGUAGE_HOST)})
    for name in PLUGINS:
        release.files[Release.plugin_tarball(name)] = tarball(
            Release.plugin_tarball(name), {f"pulumi-resource-{name}": sources[f"pulumi-resource-{name}"]})
    # A bare plugin binary, as this machine's own drop-in holds them.
    for name, version in PLUGINS.items():
        release.files[f"pulumi-resource-{name}-v{version}"] = sources[f"pulumi-resource-{name}"]
    return release


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cache: Path

    @property
    def env_file(self) -> Path:
        return Path(self.stdout.strip().splitlines()[-1])


def install(cache: Path, dropin: Path, *args: str, path: str = BARE_PATH) -> Run:
    env = {"PATH": path, "HOME": os.environ["HOME"], "KIMIPD_CACHE": str(cache),
           "KIMIPD_PULUMI_DROPIN": str(dropin), "KIMIPD_PULUMI_OFFLINE": "1",
           "KIMIPD_PULUMI_NO_BUILD": "1"}
    started = time.monotonic()
    result = subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, env=env,
                            timeout=540, check=False)
    return Run(result.returncode, result.stdout, result.stderr, time.monotonic() - started, cache)


def installed_plugins(env_file: Path) -> set[tuple[str, str]]:
    listed = sourced(env_file, "pulumi plugin ls --json")
    assert listed.returncode == 0, listed.stderr
    return {(p["name"], p["version"]) for p in json.loads(listed.stdout or "[]")
            if p.get("kind") == "resource"}


def test_a_fresh_cache_installs_the_cli_tarball_and_the_plugin_tarballs(release: Release,
                                                                        tmp_path: Path) -> None:
    tarballs = [release.cli_tarball, *(Release.plugin_tarball(n) for n in PLUGINS)]
    dropin = release.dropin(tmp_path / "dropin", tarballs,
                            sums={n: d for n, d in release.sums().items() if n in tarballs})
    cold = install(tmp_path / "cache", dropin)
    assert cold.returncode == 0, cold.stderr
    print(f"fresh cache, from the drop-in: {cold.seconds:.1f}s")
    bin_dir = tmp_path / "cache" / "pulumi" / f"v{release.cli_version}" / "bin"
    assert f"using pulumi v{release.cli_version} from {bin_dir} (unpacked from {release.cli_tarball})" \
        in cold.stderr
    for name in tarballs:
        assert f"sha256 matches {dropin}/SHA256SUMS: {name}" in cold.stderr
    for name, version in PLUGINS.items():
        assert (f"pulumi plugin install resource {name} {version} --file "
                f"{dropin}/{Release.plugin_tarball(name)}") in cold.stderr
    assert "MISSING" not in cold.stderr
    for name in LANGUAGE_HOST:
        assert (bin_dir / name).exists(), f"{name} not installed beside the CLI"
    assert sourced(cold.env_file, "command -v pulumi").stdout.strip() == str(bin_dir / "pulumi")
    assert installed_plugins(cold.env_file) == set(PLUGINS.items())

    warm = install(tmp_path / "cache", dropin)
    assert warm.returncode == 0, warm.stderr
    print(f"warm: {warm.seconds:.1f}s")
    assert "unpacking" not in warm.stderr and "plugin install" not in warm.stderr, warm.stderr
    assert warm.stderr.count("already installed") == 2
    # A warm run checks files and asks the CLI its version: 0.4 s, and 10 s is room for a busy
    # machine. One that waited on something would not make it: the network probe (curl
    # --max-time 10) or a Go build (minutes); a redone unpack or install the lines above name.
    assert warm.seconds < 10, f"warm: {warm.seconds:.1f}s"


def test_a_digest_mismatch_is_refused_naming_the_file(release: Release, tmp_path: Path) -> None:
    sums = release.sums()
    docker = Release.plugin_tarball("docker")
    sums[docker] = "0" * 64
    dropin = release.dropin(tmp_path / "dropin", [release.cli_tarball, *map(Release.plugin_tarball, PLUGINS)],
                            sums={n: sums[n] for n in [release.cli_tarball, *map(Release.plugin_tarball, PLUGINS)]})
    run = install(tmp_path / "cache", dropin)
    assert run.returncode == 1, run.stderr
    assert (f"REFUSED: {dropin}/{docker} has sha256 {release.sums()[docker]} but "
            f"{dropin}/SHA256SUMS lists {'0' * 64}") in run.stderr
    assert "download it again" in run.stderr
    plugins = tmp_path / "cache" / "pulumi" / "home" / "plugins"
    assert not (plugins / "resource-docker-v5.2.0").exists(), "the refused plugin was installed"


def test_a_file_missing_from_sha256sums_is_refused(release: Release, tmp_path: Path) -> None:
    dropin = release.dropin(tmp_path / "dropin", [release.cli_tarball],
                            sums={Release.plugin_tarball("docker"): "0" * 64})
    run = install(tmp_path / "cache", dropin, "--cli-only")
    assert run.returncode == 1, run.stderr
    assert f"REFUSED: {dropin}/{release.cli_tarball} is not listed in {dropin}/SHA256SUMS" in run.stderr
    assert not (tmp_path / "cache" / "pulumi" / f"v{release.cli_version}" / "bin").exists()


def test_bare_plugin_binaries_are_still_accepted(release: Release, tmp_path: Path) -> None:
    names = [release.cli_tarball, *(f"pulumi-resource-{n}-v{v}" for n, v in PLUGINS.items())]
    run = install(tmp_path / "cache", release.dropin(tmp_path / "dropin", names))
    assert run.returncode == 0, run.stderr
    assert installed_plugins(run.env_file) == set(PLUGINS.items())


def test_an_official_cli_on_path_wins_over_the_dropin(release: Release, tmp_path: Path) -> None:
    official = tmp_path / "official" / "bin"
    official.mkdir(parents=True)
    with tarfile.open(release.files[release.cli_tarball]) as archive:
        for member in archive.getmembers():
            member.name = Path(member.name).name
            archive.extract(member, official)
    dropin = release.dropin(tmp_path / "dropin", list(release.files))
    run = install(tmp_path / "cache", dropin, path=f"{official}:{BARE_PATH}")
    assert run.returncode == 0, run.stderr
    assert f"using pulumi v{release.cli_version} from {official} (on PATH)" in run.stderr
    assert "unpacking" not in run.stderr
    assert sourced(run.env_file, "command -v pulumi").stdout.strip() == str(official / "pulumi")


def test_nothing_to_install_from_says_which_file_to_carry(tmp_path: Path) -> None:
    run = install(tmp_path / "cache", tmp_path / "empty-dropin")
    assert run.returncode == 1, run.stderr
    assert "KIMIPD_PULUMI_NO_BUILD=1: not building" in run.stderr
    assert (f"no pulumi CLI could be obtained: put the official pulumi-v3.272.0-linux-x64.tar.gz "
            f"in {tmp_path / 'empty-dropin'}") in run.stderr
