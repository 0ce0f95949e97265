"""scripts/build-keepalived-image: keepalived's image for an operator's registry, built with the
sim's recipe (sim/debian-image.sh). debootstrap, docker and id are fakes first on PATH: nothing
reaches a Debian mirror or a registry, and nothing needs root."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "build-keepalived-image"
DIGEST = "sha256:" + "5e" * 32
REPOSITORY = "registry.example:5000/kimipd/keepalived"

FAKE_DEBOOTSTRAP = """#!/usr/bin/env bash
# the last three arguments: SUITE TARGET MIRROR
echo "debootstrap $*" >> "$FAKE_CALLS"
args=("$@"); target=${args[-2]}
mkdir -p "$target/usr/sbin" "$target/bin" "$target/etc" "$target/usr/share/doc/keepalived"
printf '#!/bin/sh\\n' > "$target/usr/sbin/keepalived"; chmod +x "$target/usr/sbin/keepalived"
if [ -z "${FAKE_NO_BASH:-}" ]; then
  printf '#!/bin/sh\\n' > "$target/bin/bash"; chmod +x "$target/bin/bash"
fi
echo copyright > "$target/usr/share/doc/keepalived/copyright"
"""
FAKE_DOCKER = f"""#!/usr/bin/env bash
echo "docker $*" >> "$FAKE_CALLS"
case "$1" in
  import) cat > "$FAKE_CALLS.tar"; echo sha256:1234 ;;
  push) echo "The push refers to repository [${{2%:*}}]"
        echo "${{2##*:}}: digest: {DIGEST} size: 528" ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture
def fakes(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("debootstrap", FAKE_DEBOOTSTRAP), ("docker", FAKE_DOCKER),
                       ("id", "#!/bin/sh\necho 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
            "KIMIPD_CACHE": str(tmp_path / "cache"), "FAKE_CALLS": str(tmp_path / "calls"),
            "KIMIPD_DEBIAN_MIRROR": "http://mirror.invalid/debian"}


def build(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def calls(env: dict[str, str]) -> list[str]:
    path = Path(env["FAKE_CALLS"])
    return path.read_text().splitlines() if path.exists() else []


def test_it_builds_keepalived_pushes_it_and_prints_the_reference(fakes: dict[str, str]) -> None:
    result = build(fakes, REPOSITORY)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{REPOSITORY}@{DIGEST}\n"
    debootstrap, docker_import, docker_push = calls(fakes)
    assert debootstrap.startswith("debootstrap --variant=minbase --include=keepalived ")
    assert debootstrap.endswith(" bookworm "
                                f"{fakes['KIMIPD_CACHE']}/keepalived-image/work-keepalived "
                                "http://mirror.invalid/debian")
    # The sim's image: keepalived in the foreground as its entrypoint, the inputs' key (its
    # first 12 characters) as the tag.
    key = re.findall(r"org\.kimipd\.inputs=([0-9a-f]{64}) ", docker_import)[0]
    tag = key[:12]
    assert docker_import == (
        f"docker import --change LABEL org.kimipd.inputs={key} "
        "--change ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
        '--change ENTRYPOINT ["/usr/sbin/keepalived", "-n", "-l", "-D", "-f"] '
        '--change CMD ["/etc/keepalived/keepalived.conf"] '
        f"- {REPOSITORY}:{tag}")
    assert docker_push == f"docker push {REPOSITORY}:{tag}"
    with tarfile.open(fakes["FAKE_CALLS"] + ".tar") as rootfs:
        names = rootfs.getnames()
        record = rootfs.extractfile("./etc/kimipd-image")
        assert record is not None and b"packages=keepalived" in record.read()
    assert {"./usr/sbin/keepalived", "./bin/bash"} <= set(names)
    assert not [name for name in names if name.startswith("./usr/share/doc/")
                and name != "./usr/share/doc"]


def test_a_second_run_reuses_the_root_filesystem(fakes: dict[str, str]) -> None:
    assert build(fakes, REPOSITORY).returncode == 0
    again = build(fakes, REPOSITORY)
    assert again.returncode == 0 and again.stdout == f"{REPOSITORY}@{DIGEST}\n"
    assert [call.split()[:2] for call in calls(fakes)] == [
        ["debootstrap", "--variant=minbase"], ["docker", "import"], ["docker", "push"],
        ["docker", "import"], ["docker", "push"]]


def test_a_rootfs_without_bash_is_refused(fakes: dict[str, str]) -> None:
    result = build(fakes | {"FAKE_NO_BASH": "1"}, REPOSITORY)
    assert result.returncode == 1
    assert "/bin/bash missing from the image's rootfs" in result.stderr
    assert "the keepalived image's rootfs is incomplete" in result.stderr
    assert not [call for call in calls(fakes) if call.startswith("docker")]


@pytest.mark.parametrize("args", [(), ("keepalived",), (f"{REPOSITORY}:2.2.7",),
                                  (f"{REPOSITORY}@{DIGEST}",), (REPOSITORY, "extra")])
def test_it_wants_one_repository_without_tag_or_digest(fakes: dict[str, str],
                                                       args: tuple[str, ...]) -> None:
    result = build(fakes, *args)
    assert result.returncode == 2
    assert "Usage: scripts/build-keepalived-image REGISTRY/REPO" in result.stderr
    assert calls(fakes) == []
