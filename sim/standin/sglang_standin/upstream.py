"""The real SGLang, sglang-router and smg command-line parsers, runnable without a GPU.

`sglang.srt.server_args` builds SGLang's parser (`ServerArgs.add_cli_args`: ~520 option strings,
choices, aliases, argparse's prefix abbreviations), but importing it pulls in torch, triton and a
few other heavy modules. They are replaced here by import stubs that are only ever touched at
import time, and `SGLANG_USE_CPU_ENGINE=1` makes the platform probe resolve to CPU. Everything
the parser itself does (types, choices, unknown flags, abbreviations, `ServerArgs` construction)
is SGLang's own code.

Two users:
- the stand-in (`parse_with_real_sglang`): a flag real SGLang would refuse fails in the sim too;
- the contract tests: every argv the program renders parses with the pinned release.

This file also runs as a script, by path, in an interpreter whose `sys.path` holds the real
`sglang` package (the stand-in's own `sglang` shim must not shadow it, hence "by path"):
  python3 upstream.py options [--router|--smg]    the parser's option table, as JSON
  python3 upstream.py parse [--router|--smg] -- ARG...
                                                  one argv -> {"ok", "exit", "values", "error", ...}
  python3 upstream.py parse-many                  stdin: [{"kind": "server"|"router"|"smg",
                                                  "argv": [...]}]
  python3 upstream.py page-size                   stdin: [{dest: value}] -> the resolved page sizes
Stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import subprocess
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

try:
    from .auth import safe_error, scrub, secret_values
except ImportError:  # run as a script, by path: auth.py (stdlib only) is beside it on sys.path[0]
    from auth import safe_error, scrub, secret_values  # type: ignore[no-redef]

# Modules SGLang imports at module level but never uses while parsing flags. Real ones win when
# installed (the stub finder is the last on sys.meta_path).
STUBBED_MODULES = frozenset({
    "torch", "triton", "torchvision", "zmq", "xgrammar", "partial_json_parser", "openai",
    "aiohttp", "IPython",
})
# Installed, but the parser never touches them either: `sglang/__init__.py`, `sglang.srt.utils`
# and the OpenAI protocol models import them at module level. Stubbed even where installed (the
# lean finder goes first on sys.meta_path): that cuts each parse from about 0.8 s to 0.4 s of
# CPU, and the sim starts 8 ranks on 2 cores at once, each parsing before its bootstrap or HTTP
# port opens. `SGLANG_STANDIN_PARSER_IMPORTS=full` imports them for real; the contract tests
# check that both give the same option table and the same values.
LEAN_STUBBED_MODULES = (
    "aiohttp", "numpy", "PIL", "requests", "urllib3", "charset_normalizer", "psutil", "tqdm",
    "sglang.lang", "sglang.srt.entrypoints.openai",
)
PARSER_IMPORTS_ENV = "SGLANG_STANDIN_PARSER_IMPORTS"
# `hasattr(torch, "npu")` is how SGLang detects other accelerators; these must be absent.
_ABSENT = {"torch": frozenset({"npu", "hpu", "xpu", "musa", "mlu"})}

# Where the stand-in finds the real sglang (a `pip install --target` directory); see sim/sim.
REAL_SGLANG_DIR_ENV = "SGLANG_STANDIN_REAL_SGLANG"
DEFAULT_REAL_SGLANG_DIR = "/opt/sglang-real"


class _StubBase:
    """A base class for `class X(torch.nn.Module)` and friends."""

    def __init_subclass__(cls, **_kwargs: Any) -> None:
        pass

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Stub(item)

    @classmethod
    def __get_pydantic_core_schema__(cls, _source: Any, _handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()


class _Stub:
    """Any attribute, call, operator or decorator of a stubbed module; falsy."""

    def __init__(self, name: str = "stub") -> None:
        self._name = name

    def __getattr__(self, item: str) -> "_Stub":
        if item.startswith("__"):
            raise AttributeError(item)
        return _Stub(f"{self._name}.{item}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: keep the function
        return _Stub(f"{self._name}()")

    def __mro_entries__(self, _bases: tuple) -> tuple:
        return (_StubBase,)

    def __getitem__(self, _key: Any) -> "_Stub":
        return _Stub(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    __int__ = __index__

    def __float__(self) -> float:
        return 0.0

    def __contains__(self, _item: Any) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: Any) -> bool:
        return self is other

    def __enter__(self) -> "_Stub":
        return self

    def __exit__(self, *_exc: Any) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


def _operator(self: _Stub, *_args: Any) -> _Stub:
    return _Stub(self._name)


for _name in ("neg pos abs invert add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv "
              "mod rmod pow rpow and rand or ror xor rxor lshift rshift lt le gt ge matmul").split():
    setattr(_Stub, f"__{_name}__", _operator)


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") or item in _ABSENT.get(self.__name__, ()):
            raise AttributeError(item)
        if item[:1].isupper():  # a class: something may subclass it or use it in a type hint
            stub_class = type(item, (_StubBase,), {"__module__": self.__name__})
            setattr(self, item, stub_class)
            return stub_class
        return _Stub(f"{self.__name__}.{item}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in STUBBED_MODULES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        if spec.name == "torch":
            module.__version__ = "2.9.0"
            module.version = types.SimpleNamespace(hip=None, cuda=None, musa=None,
                                                   __version__="2.9.0")
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _LeanStubFinder(_StubFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if any(name == lean or name.startswith(lean + ".") for lean in LEAN_STUBBED_MODULES):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None


def _install_stubs() -> None:
    if not any(type(finder) is _StubFinder for finder in sys.meta_path):
        sys.meta_path.append(_StubFinder())
    lean = os.environ.get(PARSER_IMPORTS_ENV, "lean")
    if lean not in ("lean", "full"):
        raise SystemExit(f"{PARSER_IMPORTS_ENV}={lean!r}: use 'lean' (default) or 'full'")
    if lean == "lean" and not any(type(finder) is _LeanStubFinder for finder in sys.meta_path):
        sys.meta_path.insert(0, _LeanStubFinder())
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"


# -- the parsers ------------------------------------------------------------------------------


def server_parser() -> argparse.ArgumentParser:
    """SGLang's own parser, built as `sglang.srt.server_args.prepare_server_args` builds it."""
    _install_stubs()
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def router_parser(release: str = "sglang-router") -> argparse.ArgumentParser:
    """A router's parser, built as its `launch_router.parse_router_args` does: sglang-router's
    (MiniLB lives there) or smg's (the rust router)."""
    if release == "smg":
        from smg.router_args import RouterArgs
    else:
        from sglang_router.router_args import RouterArgs  # type: ignore[no-redef]

    parser = argparse.ArgumentParser(prog=f"{release.replace('-', '_')}.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in ("sglang", "sglang-router", "smg"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return found


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def option_table(parser: argparse.ArgumentParser) -> List[Dict[str, Any]]:
    """Every option of the parser, enough to rebuild an equivalent one (see components/cli_spec)."""
    table = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public view of its options
        if not action.option_strings or isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        kind = type(action).__name__
        table.append({
            "options": list(action.option_strings),
            "dest": action.dest,
            "nargs": action.nargs,
            "takes_value": action.nargs != 0,
            "const": _jsonable(action.const),
            "default": _jsonable(action.default),
            "choices": sorted(map(str, action.choices)) if action.choices is not None else None,
            "type": getattr(action.type, "__name__", None) if action.type else None,
            "action": kind,
        })
    return sorted(table, key=lambda option: option["options"][0])


def parse(argv: List[str], router: str = "") -> Dict[str, Any]:
    """Parse with the real parser; argparse's exit (status 2) becomes {"ok": False, "error"}.

    A server argv with `--config FILE` is first merged with the file by SGLang's own
    ConfigArgumentMerger, as `prepare_server_args` does; what it raises (SGLang ends with that
    traceback, exit 1) becomes {"ok": False, "exit": 1, "error"}. No error carries the value of
    --api-key or --admin-api-key.
    """
    parser = router_parser(router) if router else server_parser()
    if not router and "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        try:
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        except Exception as error:  # noqa: BLE001 - whatever prepare_server_args lets out
            return {"ok": False, "exit": 1, "values": {}, "error": safe_error(error, argv),
                    "versions": versions()}
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            namespace = parser.parse_args(argv)
            if not router:
                # The record SGLang builds from the flags; resolution needs the model and the GPUs.
                from sglang.srt.server_args import ServerArgs

                ServerArgs.from_cli_args(namespace)
    except SystemExit as stop:
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        error = scrub(lines[-1], secret_values(argv)) if lines else f"exit {stop.code}"
        return {"ok": False, "exit": 2, "values": {}, "error": error, "versions": versions()}
    values = {key: _jsonable(value) for key, value in vars(namespace).items()}
    return {"ok": True, "exit": 0, "values": values, "error": "", "versions": versions()}


def resolved_page_size(flags: Dict[str, Any]) -> Optional[int]:
    """The page size SGLang's own post-processing gives FLAGS (page_size and the attention
    backends by dest): its backend snaps, then its default where none is set."""
    server_parser()  # the import stubs
    from sglang.srt.arg_groups import overrides

    view = types.SimpleNamespace(**{"page_size": None, "attention_backend": None,
                                    "decode_attention_backend": None,
                                    "prefill_attention_backend": None,
                                    "speculative_draft_attention_backend": None, **flags})
    with contextlib.redirect_stderr(io.StringIO()):
        view.page_size = overrides._mla_backend_page_constraints(view).get("page_size",
                                                                           view.page_size)
        if view.page_size is None:
            view.page_size = overrides._page_size_default(view).get("page_size")
    return view.page_size


# -- the stand-in's entry ------------------------------------------------------------------


@dataclass
class RealParse:
    ok: bool
    values: Dict[str, Any] = field(default_factory=dict)
    error: str = ""
    version: str = ""
    exit_code: int = 2  # what SGLang would exit with when not ok


def parse_with_real_sglang(argv: List[str]) -> Optional[RealParse]:
    """The real 0.5.x parser's verdict on ARGV, or None where the real sglang is not installed.

    Runs in a child interpreter with the real package first on its path: the stand-in itself
    answers to `python3 -m sglang.launch_server`, so the two `sglang` packages cannot share one.
    """
    real_dir = os.environ.get(REAL_SGLANG_DIR_ENV, DEFAULT_REAL_SGLANG_DIR)
    if not os.path.isdir(os.path.join(real_dir, "sglang")):
        return None
    env = dict(os.environ, PYTHONPATH=real_dir)
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "parse", "--", *argv],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the real SGLang parser failed to run:\n{result.stderr[-2000:]}")
    answer = json.loads(result.stdout)
    return RealParse(ok=answer["ok"], values=answer["values"], error=answer["error"],
                     version=answer["versions"].get("sglang", ""),
                     exit_code=answer.get("exit", 2))


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    # --router: sglang-router's parser (MiniLB); --smg: smg's (the rust router).
    router = {"--router": "sglang-router", "--smg": "smg"}.get(args[0] if args else "", "")
    if router:
        args.pop(0)
    if command == "options":
        parser = router_parser(router) if router else server_parser()
        print(json.dumps({"versions": versions(), "options": option_table(parser)}, indent=1))
    elif command == "parse":
        if args[:1] == ["--"]:
            args.pop(0)
        print(json.dumps(parse(args, router=router)))
    elif command == "parse-many":
        requests = json.load(sys.stdin)
        releases = {"router": "sglang-router", "smg": "smg"}
        print(json.dumps([parse(item["argv"], router=releases.get(item["kind"], ""))
                          for item in requests]))
    elif command == "page-size":
        print(json.dumps([resolved_page_size(item) for item in json.load(sys.stdin)]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
