"""Who may call rank 0's API: SGLang 0.5.19's API-key rules, and keeping the keys out of logs.

SGLang (sglang/srt/utils/auth.py, `decide_request_auth`) gives each route an auth level:
- every route it does not mark, and every path no route matches, is NORMAL: it needs --api-key
  when one is set;
- ADMIN_OPTIONAL routes need --admin-api-key when one is set (--api-key is then refused), else
  --api-key when one is set, else nothing;
- ADMIN_FORCE routes need --admin-api-key and are refused (403) when none is set; 0.5.19 marks
  none (see the FIXME above `_admin_api_key_missing_response` in http_server.py).
OPTIONS, and any path that starts with /health or /metrics, are always allowed. The middleware
(`add_api_key_middleware`) runs before routing and is installed only when a key is set, so an
unknown path is refused (401) rather than answered 404. A route is matched as Starlette matches
it: path and method (a HEAD on a GET route, or a path with a trailing slash, is no match, hence
NORMAL). The bootstrap server and the dummy health server of ranks >= 1 have no such middleware.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

NORMAL = "normal"
ADMIN_OPTIONAL = "admin_optional"
ADMIN_FORCE = "admin_force"

_GET_POST = frozenset({"GET", "POST"})
_POST = frozenset({"POST"})

# SGLang 0.5.19's routes decorated `@auth_level(AuthLevel.ADMIN_OPTIONAL)`, with the methods of
# their `@app.get/post/api_route` (sglang/srt/entrypoints/http_server.py; the last two from
# sglang/srt/entrypoints/elastic_ep.py, included into the app). tests/test_auth.py reads them
# back from the real source.
ADMIN_OPTIONAL_ROUTES: Tuple[Tuple[str, FrozenSet[str]], ...] = (
    ("/set_internal_state", frozenset({"POST", "PUT"})),
    ("/flush_cache", _GET_POST),
    ("/add_external_corpus", _POST),
    ("/remove_external_corpus", _POST),
    ("/list_external_corpora", frozenset({"GET"})),
    ("/clear_hicache_storage_backend", _GET_POST),
    ("/hicache/storage-backend/clear", _POST),
    ("/hicache/storage-backend", frozenset({"PUT"})),
    ("/hicache/storage-backend", frozenset({"DELETE"})),
    ("/hicache/storage-backend", frozenset({"GET"})),
    ("/start_profile", _GET_POST),
    ("/stop_profile", _GET_POST),
    ("/freeze_gc", _GET_POST),
    ("/start_expert_distribution_record", _GET_POST),
    ("/stop_expert_distribution_record", _GET_POST),
    ("/dump_expert_distribution_record", _GET_POST),
    ("/update_weights_from_disk", _POST),
    ("/init_weights_send_group_for_remote_instance", _POST),
    ("/send_weights_to_remote_instance", _POST),
    ("/get_remote_instance_transfer_engine_info", frozenset({"GET"})),
    ("/remote_instance_transfer_engine_info", frozenset({"GET"})),
    ("/init_weights_update_group", _POST),
    ("/destroy_weights_update_group", _POST),
    ("/update_weights_from_tensor", _POST),
    ("/update_weights_from_distributed", _POST),
    ("/update_weights_from_ipc", _POST),
    ("/update_weight_version", _POST),
    ("/get_weights_by_name", _GET_POST),
    ("/release_memory_occupation", _GET_POST),
    ("/resume_memory_occupation", _GET_POST),
    ("/weights_checker", _GET_POST),
    ("/slow_down", _GET_POST),
    ("/load_lora_adapter", _POST),
    ("/unload_lora_adapter", _POST),
    ("/configure_logging", _GET_POST),
    ("/abort_request", _POST),
    ("/pause_generation", _POST),
    ("/continue_generation", _POST),
    ("/scale_elastic_ep", _POST),
    ("/is_scaling_elastic_ep", frozenset({"GET"})),
)
# Registered only when DUMPER_SERVER_PORT=reuse (http_server.py, at import).
DUMPER_ROUTE: Tuple[str, FrozenSet[str]] = ("/dumper/{method}", _POST)
# 0.5.19 has none.
ADMIN_FORCE_ROUTES: Tuple[Tuple[str, FrozenSet[str]], ...] = ()

# Flags whose values are secrets: never in a log line or in /server_info.
SECRET_OPTIONS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
REDACTED = "<redacted>"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    status: int = 401  # only when not allowed

    def body(self) -> bytes:
        """What SGLang's middleware answers with (an ORJSONResponse: compact JSON)."""
        error = "Unauthorized" if self.status == 401 else "Forbidden"
        return json.dumps({"error": error}, separators=(",", ":")).encode()


def _path_regex(template: str) -> "re.Pattern[str]":
    """A Starlette route path as a regex: `{name}` is one segment, `{name:path}` the rest."""
    out, pos = "", 0
    for m in re.finditer(r"{(\w+)(:path)?}", template):
        out += re.escape(template[pos:m.start()]) + (".*" if m.group(2) else "[^/]+")
        pos = m.end()
    return re.compile(out + re.escape(template[pos:]) + r"\Z")


class RouteLevels:
    """The auth level of a request, by the first route that matches its path and method."""

    def __init__(self, dumper_route: bool = False) -> None:
        routes: List[Tuple[str, FrozenSet[str], str]] = [
            (path, methods, ADMIN_OPTIONAL) for path, methods in ADMIN_OPTIONAL_ROUTES]
        if dumper_route:
            routes.append((DUMPER_ROUTE[0], DUMPER_ROUTE[1], ADMIN_OPTIONAL))
        routes += [(path, methods, ADMIN_FORCE) for path, methods in ADMIN_FORCE_ROUTES]
        self._routes = [(_path_regex(path), methods, level) for path, methods, level in routes]

    def level(self, method: str, path: str) -> str:
        for regex, methods, level in self._routes:
            if method in methods and regex.match(path):
                return level
        return NORMAL


def _bearer_matches(authorization: Optional[str], expected: str) -> bool:
    if not authorization:
        return False
    parts = authorization.split(" ", 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    return secrets.compare_digest(parts[1], expected)


def decide(method: str, path: str, authorization: Optional[str], api_key: Optional[str],
           admin_api_key: Optional[str], level: str) -> Decision:
    if method == "OPTIONS" or path.startswith("/health") or path.startswith("/metrics"):
        return Decision(True)
    if level == ADMIN_FORCE:
        if not admin_api_key:
            return Decision(False, 403)
        return Decision(_bearer_matches(authorization, admin_api_key))
    if level == ADMIN_OPTIONAL:
        key = admin_api_key or api_key
        return Decision(_bearer_matches(authorization, key) if key else True)
    return Decision(_bearer_matches(authorization, api_key) if api_key else True)


class ApiKeys:
    """Rank 0's keys, and whether SGLang would check them at all: it installs the middleware
    only when a key is set (or a route is ADMIN_FORCE), and only with one tokenizer worker."""

    def __init__(self, api_key: Optional[str], admin_api_key: Optional[str],
                 tokenizer_workers: int = 1, dumper_route: bool = False) -> None:
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.enforced = (bool(api_key or admin_api_key or ADMIN_FORCE_ROUTES)
                         and tokenizer_workers == 1)
        self.levels = RouteLevels(dumper_route)

    def check(self, method: str, path: str, authorization: Optional[str]) -> Decision:
        if not self.enforced:
            return Decision(True)
        return decide(method, path, authorization, self.api_key, self.admin_api_key,
                      self.levels.level(method, path))

    def describe(self) -> str:
        """A log line that says which keys are set, never what they are."""
        def state(key: Optional[str]) -> str:
            return "set" if key else "not set"

        line = f"--api-key {state(self.api_key)}, --admin-api-key {state(self.admin_api_key)}"
        if (self.api_key or self.admin_api_key) and not self.enforced:
            line += " (not enforced: SGLang adds no key check with --tokenizer-worker-num > 1)"
        return line


def secret_values(argv: Iterable[str]) -> List[str]:
    """The values given to SECRET_OPTIONS in ARGV (also as `--opt=value`, with underscores, or
    abbreviated as argparse allows)."""
    def secret_flag(flag: str) -> bool:
        flag = flag.replace("_", "-").lower()
        return len(flag) > 3 and any(option.startswith(flag) for option in SECRET_OPTIONS)

    values: List[str] = []
    argv = list(argv)
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        flag, eq, value = token.partition("=")
        if not secret_flag(flag):
            continue
        if eq:
            values.append(value)
        elif i + 1 < len(argv):
            values.append(argv[i + 1])
    return [v for v in values if v]


def scrub(text: str, secrets_: Iterable[str]) -> str:
    for value in sorted(set(secrets_), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def safe_error(error: BaseException, argv: Iterable[str]) -> str:
    """`Type: message` of an error met while reading the flags, with nothing that could carry a
    key: no secret flag's value, and for a YAML error not the snippet of the file it quotes."""
    mark = getattr(error, "problem_mark", None)
    if mark is not None:  # yaml.MarkedYAMLError
        text = (f"{type(error).__name__}: {getattr(error, 'problem', None) or 'invalid YAML'} "
                f"(line {mark.line + 1}, column {mark.column + 1})")
    else:
        text = f"{type(error).__name__}: {error}"
    return scrub(text, secret_values(argv))


def redacted(values: Dict[str, object]) -> Dict[str, object]:
    """VALUES (parsed flags) with every secret that is set replaced by REDACTED."""
    names = {option[2:].replace("-", "_") for option in SECRET_OPTIONS}
    return {k: (REDACTED if k in names and v else v) for k, v in values.items()}
