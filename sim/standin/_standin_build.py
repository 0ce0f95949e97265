"""In-tree PEP 517 build backend (stdlib only) for kimipd-sglang-standin.

Why not setuptools: the setuptools that ships with Python 3.11 (65.x) cannot build a wheel without
the separate `wheel` package, so `pip install ./sim/standin` would have to download build
dependencies.  This backend needs nothing, so the build works offline, with or without
`--no-build-isolation`, on any Python >= 3.9.  The runtime dependencies (`[project] dependencies`)
go into the wheel's metadata as `Requires-Dist`, and pip installs them as for any package.

It packs the two pure-Python packages `sglang_standin` and the `sglang` shim, plus the console
script `sglang-standin`.  Hooks: build_wheel, build_sdist, build_editable (PEP 660) and the
get_requires_* / prepare_metadata_* hooks.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PACKAGES = ("sglang_standin", "sglang")


def _project():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib  # Python >= 3.11

        proj = tomllib.loads(text)["project"]
        return {
            "name": proj["name"],
            "version": proj["version"],
            "description": proj.get("description", ""),
            "requires_python": proj.get("requires-python", ""),
            "scripts": dict(proj.get("scripts", {})),
            "dependencies": list(proj.get("dependencies", [])),
            "extras": {k: list(v) for k, v in proj.get("optional-dependencies", {}).items()},
        }
    except ImportError:  # Python 3.9 / 3.10: the few fields we need, by pattern
        def field(key):
            m = re.search(rf'^{key}\s*=\s*"([^"]*)"', text, re.M)
            return m.group(1) if m else ""

        scripts = dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+:\w+)"', text.split("[project.scripts]", 1)[-1], re.M))
        deps = re.search(r'^dependencies\s*=\s*\[([^\]]*)\]', text, re.M)
        return {"name": field("name"), "version": field("version"),
                "description": field("description"), "requires_python": field("requires-python"),
                "scripts": scripts, "extras": {},
                "dependencies": re.findall(r'"([^"]+)"', deps.group(1)) if deps else []}


def _dist_name(p) -> str:
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


def _metadata(p) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p['description']}",
    ]
    if p["requires_python"]:
        lines.append(f"Requires-Python: {p['requires_python']}")
    for r in p["dependencies"]:
        lines.append(f"Requires-Dist: {r}")
    for extra, reqs in sorted(p["extras"].items()):
        lines.append(f"Provides-Extra: {extra}")
        for r in reqs:
            lines.append(f'Requires-Dist: {r}; extra == "{extra}"')
    return "\n".join(lines) + "\n"


def _dist_info_files(p):
    files = {
        "METADATA": _metadata(p),
        "WHEEL": "Wheel-Version: 1.0\nGenerator: _standin_build\nRoot-Is-Purelib: true\n"
                 "Tag: py3-none-any\n",
        "top_level.txt": "\n".join(PACKAGES) + "\n",
    }
    if p["scripts"]:
        files["entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in sorted(p["scripts"].items())
        )
    return files


def _package_files():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            yield path.relative_to(ROOT).as_posix(), path.read_bytes()


def _write_wheel(wheel_directory, payload) -> str:
    p = _project()
    dist = _dist_name(p)
    name = f"{dist}-{p['version']}-py3-none-any.whl"
    info = f"{dist}-{p['version']}.dist-info"
    entries = list(payload) + [
        (f"{info}/{k}", v.encode("utf-8")) for k, v in _dist_info_files(p).items()
    ]
    record = []
    os.makedirs(wheel_directory, exist_ok=True)
    stamp = (2020, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in entries:
            zi = zipfile.ZipInfo(arc, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zi = zipfile.ZipInfo(f"{info}/RECORD", stamp)
        zi.external_attr = 0o644 << 16
        zf.writestr(zi, "\n".join(record) + "\n")
    return name


# ---- PEP 517 hooks


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p = _project()
    info = f"{_dist_name(p)}-{p['version']}.dist-info"
    d = Path(metadata_directory) / info
    d.mkdir(parents=True, exist_ok=True)
    for k, v in _dist_info_files(p).items():
        (d / k).write_text(v, encoding="utf-8")
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    p = _project()
    pth = (f"{_dist_name(p)}.pth", (str(ROOT) + "\n").encode("utf-8"))
    return _write_wheel(wheel_directory, [pth])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{_dist_name(p)}-{p['version']}"
    name = f"{base}.tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    members = [("pyproject.toml", (ROOT / "pyproject.toml").read_bytes()),
               ("_standin_build.py", (ROOT / "_standin_build.py").read_bytes()),
               ("PKG-INFO", _metadata(p).encode("utf-8"))]
    if (ROOT / "README.md").exists():
        members.append(("README.md", (ROOT / "README.md").read_bytes()))
    members += list(_package_files())
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for arc, data in members:
            ti = tarfile.TarInfo(f"{base}/{arc}")
            ti.size = len(data)
            ti.mtime = int(time.time())
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(data))
    return name
