"""The stand-in's API-key decisions against SGLang 0.5.19's own (sglang/srt/utils/auth.py).

The real `decide_request_auth` is loaded by file path from $KIMIPD_REAL_SGLANG_VENV (it imports
nothing heavy), and each route's real auth level is read from the source of SGLang's app
(http_server.py and the routers it includes) with `ast`: no FastAPI, no torch. Skipped only when
that venv is not there (scripts/setup-real-sglang makes it).
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Dict, FrozenSet, List, Optional, Tuple

import pytest

STANDIN_DIR = Path(__file__).resolve().parents[1]
if str(STANDIN_DIR) not in sys.path:
    sys.path.insert(0, str(STANDIN_DIR))

from sglang_standin import auth  # noqa: E402


def real_sglang_dir() -> Path:
    venv = os.environ.get("KIMIPD_REAL_SGLANG_VENV")
    if not venv or not Path(venv).is_dir():
        pytest.skip(f"KIMIPD_REAL_SGLANG_VENV is {'unset' if not venv else 'missing: ' + venv}: "
                    "export KIMIPD_REAL_SGLANG_VENV=$(scripts/setup-real-sglang) to hold the "
                    "stand-in's API-key rules to SGLang's")
    found = sorted(Path(venv).glob("lib/python3*/site-packages/sglang"))
    assert found, f"no sglang package under {venv}/lib/python3*/site-packages"
    return found[-1]


@pytest.fixture(scope="module")
def sglang_dir() -> Path:
    return real_sglang_dir()


@pytest.fixture(scope="module")
def real_auth(sglang_dir: Path) -> ModuleType:
    path = sglang_dir / "srt" / "utils" / "auth.py"
    spec = importlib.util.spec_from_file_location("real_sglang_auth", path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


# ------------------------------------------------------------------------------------------------
# SGLang's routes and their auth levels, from the source


@dataclass(frozen=True)
class Route:
    path: str
    methods: FrozenSet[str]
    level: str  # "NORMAL", "ADMIN_OPTIONAL" or "ADMIN_FORCE"
    line: int
    conditional: bool  # registered inside a module-level `if` (an environment switch)


_VERBS = {"get", "post", "put", "delete", "patch", "head", "options"}


def _route_path(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    # @app.post(os.environ.get("SGLANG_OLLAMA_CHAT_ROUTE", "/api/chat")): the default
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" and len(node.args) == 2):
        return _route_path(node.args[1])
    return None


def _routes_in(tree: ast.Module, owner: str) -> List[Route]:
    """Routes registered by `@<owner>.get/post/.../api_route(...)` decorators, with the level
    of the `@auth_level(AuthLevel.X)` beside them (none: NORMAL)."""
    conditional_lines = {n.lineno for stmt in tree.body if isinstance(stmt, ast.If)
                         for n in ast.walk(stmt) if hasattr(n, "lineno")}
    routes = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        level = "NORMAL"
        registered: List[Tuple[ast.Call, FrozenSet[str]]] = []
        for dec in func.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            if isinstance(dec.func, ast.Name) and dec.func.id == "auth_level":
                level = dec.args[0].attr  # AuthLevel.X
            elif (isinstance(dec.func, ast.Attribute) and isinstance(dec.func.value, ast.Name)
                  and dec.func.value.id == owner):
                verb = dec.func.attr
                if verb in _VERBS:
                    registered.append((dec, frozenset({verb.upper()})))
                elif verb == "api_route":
                    methods = [k.value for k in dec.keywords if k.arg == "methods"]
                    registered.append((dec, frozenset(ast.literal_eval(methods[0]))
                                       if methods else frozenset({"GET"})))
        for dec, methods in registered:
            path = _route_path(dec.args[0])
            assert path is not None or level == "NORMAL", (
                f"line {dec.lineno}: cannot read the path of a {level} route")
            if path is not None:
                routes.append(Route(path, methods, level, dec.lineno,
                                    dec.lineno in conditional_lines))
    return routes


def real_routes(sglang_dir: Path) -> List[Route]:
    """Every route of SGLang's FastAPI app in registration order: http_server.py's own, and
    those of each `router` it imports and includes, at the place of its include_router."""
    server = sglang_dir / "srt" / "entrypoints" / "http_server.py"
    tree = ast.parse(server.read_text(encoding="utf-8"))
    routes = _routes_in(tree, "app")
    routers = {alias.asname or alias.name: node.module
               for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
               for alias in node.names if alias.name == "router"}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "include_router" and isinstance(node.args[0], ast.Name)):
            module = routers[node.args[0].id]
            source = sglang_dir.parent / (module.replace(".", "/") + ".py")
            included = _routes_in(ast.parse(source.read_text(encoding="utf-8")), "router")
            routes += [Route(r.path, r.methods, r.level, node.lineno, r.conditional)
                       for r in included]
    return sorted(routes, key=lambda r: r.line)


def _regex(template: str) -> "re.Pattern[str]":
    """Starlette's path syntax: `{name}` one segment, `{name:path}` the rest."""
    parts = re.split(r"(\{\w+(?::path)?\})", template)
    return re.compile("".join((".*" if ":path" in part else "[^/]+") if part.startswith("{")
                              else re.escape(part) for part in parts) + r"\Z")


def real_level(routes: List[Route], method: str, path: str) -> str:
    """As Starlette matches: the first route whose path and method both match (a path match
    with another method is only partial), else NORMAL."""
    for route in routes:
        if method in route.methods and _regex(route.path).match(path):
            return route.level
    return "NORMAL"


@pytest.fixture(scope="module")
def routes(sglang_dir: Path) -> List[Route]:
    found = real_routes(sglang_dir)
    assert len(found) > 50 and any(r.level == "ADMIN_OPTIONAL" for r in found), found
    return found


def test_route_table_is_sglangs_admin_routes(routes: List[Route]) -> None:
    real = {level: {(r.path, r.methods) for r in routes if r.level == level}
            for level in ("ADMIN_OPTIONAL", "ADMIN_FORCE")}
    ours_optional = set(auth.ADMIN_OPTIONAL_ROUTES) | {auth.DUMPER_ROUTE}
    assert sorted(real["ADMIN_OPTIONAL"] - ours_optional) == [], "missing from the stand-in"
    assert sorted(ours_optional - real["ADMIN_OPTIONAL"]) == [], "not ADMIN_OPTIONAL in SGLang"
    assert real["ADMIN_FORCE"] == set(auth.ADMIN_FORCE_ROUTES)
    assert {(r.path, r.methods) for r in routes if r.conditional
            and r.level != "NORMAL"} == {auth.DUMPER_ROUTE}


# ------------------------------------------------------------------------------------------------
# the decisions


API, ADMIN = "sk-api", "sk-admin"
HEADERS = [None, "", f"Bearer {API}", f"bearer {API}", f"BEARER {ADMIN}", f"Bearer {ADMIN}",
           f"Bearer  {API}", f"Bearer {API} ", f"Basic {API}", "Bearer", API, "Bearer sk",
           f"Bearer {API}x"]
KEYS = list(itertools.product([None, "", API], [None, "", ADMIN, API]))
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
EXTRA_PATHS = ["/", "/nope", "/health", "/health_generate", "/healthz", "/metrics",
               "/metrics/x", "/flush_cache/", "/FLUSH_CACHE", "/v1/models/org/model",
               "/dumper/x", "/hicache/storage-backend/other"]


def grid_paths(routes: List[Route]) -> List[str]:
    concrete = {re.sub(r"\{\w+\}", "x1", re.sub(r"\{\w+:path\}", "a/b", r.path)) for r in routes}
    return sorted(concrete | set(EXTRA_PATHS))


def real_verdict(real_auth: ModuleType, routes: List[Route], level: str, method: str,
                 path: str, header: Optional[str], api_key: Optional[str],
                 admin_api_key: Optional[str]) -> Tuple[bool, Optional[int]]:
    """What SGLang answers: no middleware unless a key is set (or an ADMIN_FORCE route exists),
    else decide_request_auth at the route's level."""
    if not (api_key or admin_api_key or any(r.level == "ADMIN_FORCE" for r in routes)):
        return True, None
    decision = real_auth.decide_request_auth(
        method=method, path=path, authorization_header=header, api_key=api_key,
        admin_api_key=admin_api_key, auth_level=real_auth.AuthLevel[level])
    return decision.allowed, None if decision.allowed else decision.error_status_code


@pytest.mark.parametrize("dumper", [False, True], ids=["default", "DUMPER_SERVER_PORT=reuse"])
def test_decisions_match_sglangs(real_auth: ModuleType, routes: List[Route], dumper: bool) -> None:
    app = [r for r in routes if dumper or not r.conditional]
    levels = {(method, path): real_level(app, method, path)
              for method, path in itertools.product(METHODS, grid_paths(routes))}
    differ: List[str] = []
    checked = 0
    for api_key, admin_api_key in KEYS:
        keys = auth.ApiKeys(api_key, admin_api_key, dumper_route=dumper)
        for (method, path), level in levels.items():
            for header in HEADERS:
                ours = keys.check(method, path, header)
                theirs = real_verdict(real_auth, app, level, method, path, header, api_key,
                                      admin_api_key)
                checked += 1
                if (ours.allowed, None if ours.allowed else ours.status) != theirs:
                    differ.append(f"{method} {path} Authorization={header!r} "
                                  f"api_key={api_key!r} admin_api_key={admin_api_key!r}: "
                                  f"stand-in {ours}, SGLang {theirs}")
    assert not differ, f"{len(differ)} of {checked} differ:\n" + "\n".join(differ[:20])


def test_refusal_body_is_the_middlewares(sglang_dir: Path) -> None:
    source = (sglang_dir / "srt" / "utils" / "auth.py").read_text(encoding="utf-8")
    middleware = source[source.index("def add_api_key_middleware"):]
    assert '"Unauthorized"' in middleware and '"Forbidden"' in middleware
    assert "ORJSONResponse" in middleware  # compact JSON
    assert auth.Decision(False, 401).body() == b'{"error":"Unauthorized"}'
    assert auth.Decision(False, 403).body() == b'{"error":"Forbidden"}'


# ------------------------------------------------------------------------------------------------
# the stand-in's own (no SGLang needed)


def test_no_check_with_several_tokenizer_workers() -> None:
    # SGLang installs its middleware in single-tokenizer mode only
    keys = auth.ApiKeys(None, ADMIN, tokenizer_workers=2)
    assert keys.check("POST", "/flush_cache", None).allowed
    assert "not enforced" in keys.describe() and ADMIN not in keys.describe()


def test_secrets_stay_out_of_messages() -> None:
    argv = ["--model-path", "m", "--api-key", API, f"--admin_api_key={ADMIN}",
            "--ssl-keyfile-pass", "pw", "--tp", "8"]
    assert sorted(auth.secret_values(argv)) == sorted([API, ADMIN, "pw"])
    message = auth.scrub(f"unrecognized arguments: --admin_api_key={ADMIN} {API} pw",
                         auth.secret_values(argv))
    assert API not in message and ADMIN not in message and "pw" not in message
    values: Dict[str, object] = {"api_key": API, "admin_api_key": None, "tp_size": 8}
    assert auth.redacted(values) == {"api_key": auth.REDACTED, "admin_api_key": None,
                                     "tp_size": 8}
