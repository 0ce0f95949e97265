"""What the pinned SGLang and sglang-router command lines accept, without importing either.

`cli_tables/*.json` are the option tables of the real parsers (dumped by `scripts/dump-cli-tables`
from the releases in `versions.py`; the contract tests fail if a table drifts from its parser).
From a table this module rebuilds an argparse parser with the same option strings, arities,
choices and scalar types, so `extraArgs` is checked at preview the way SGLang will check it on
the node: unknown flags, bad choices, missing values, and argparse's unique-prefix abbreviations
(`--tp 8`, `--nccl-init` for `--nccl-init-addr`). Pure: no Pulumi, no SGLang.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from . import versions

TABLES_DIR = Path(__file__).resolve().parent / "cli_tables"
_SCALAR_TYPES = {"int": int, "float": float}


@dataclass(frozen=True)
class CliOption:
    options: tuple[str, ...]
    dest: str
    nargs: int | str | None
    takes_value: bool
    choices: tuple[str, ...] | None
    type: str | None


@dataclass(frozen=True)
class Occurrence:
    """One option given on a command line, as written and as the parser resolves it."""

    index: int  # position of the option token in the argv
    written: str  # `--tp=8` as given
    option: CliOption

    def value(self, argv: list[str]) -> str | None:
        """Its value in ARGV (`--tp=8` or `--tp 8`); None when the argv ends before one."""
        if "=" in self.written:
            return self.written.split("=", 1)[1]
        return argv[self.index + 1] if self.index + 1 < len(argv) else None


class CliTable:
    """One release's options: look-ups and a parser equivalent to the real one."""

    def __init__(self, name: str, version: str, options: list[CliOption]) -> None:
        self.name = name
        self.version = version
        self.options = options
        self._by_string = {string: option for option in options for string in option.options}

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    def resolve(self, token: str) -> CliOption | None:
        """The option a `--flag` or `--flag=value` token means, abbreviations included, as
        argparse resolves them; None when unknown or ambiguous."""
        name = token.split("=", 1)[0]
        if name in self._by_string:
            return self._by_string[name]
        matches = {id(option): option for string, option in self._by_string.items()
                   if string.startswith(name) and string.startswith("--")}
        return next(iter(matches.values())) if len(matches) == 1 else None

    def occurrences(self, argv: list[str]) -> list[Occurrence]:
        found = []
        for index, token in enumerate(argv):
            if token.startswith("--") and len(token) > 2:
                option = self.resolve(token)
                if option is not None:
                    found.append(Occurrence(index, token, option))
        return found

    def options_for_dest(self, dest: str) -> tuple[str, ...]:
        return tuple(string for option in self.options if option.dest == dest
                     for string in option.options)

    def check(self, argv: list[str]) -> str | None:
        """argparse's own complaint about ARGV, or None if the real parser would accept it."""
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                self._parser().parse_args(argv)
        except SystemExit:
            lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
            return lines[-1].split(": error: ", 1)[-1] if lines else "rejected"
        return None

    @cache  # noqa: B019 - tables live for the whole process
    def _parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=self.name, add_help=False)
        for option in self.options:
            if not option.takes_value:
                parser.add_argument(*option.options, dest=option.dest, action="store_const",
                                    const=True)
                continue
            kwargs: dict[str, Any] = {"dest": option.dest, "nargs": option.nargs}
            if option.choices is not None:
                kwargs["choices"] = option.choices
            else:
                kwargs["type"] = _SCALAR_TYPES.get(option.type or "", str)
            parser.add_argument(*option.options, **kwargs)
        return parser


@cache
def load_table(name: str, version: str) -> CliTable:
    raw = json.loads((TABLES_DIR / f"{name}-{version}.json").read_text())
    options = [
        CliOption(
            options=tuple(entry["options"]),
            dest=entry["dest"],
            nargs=entry["nargs"],
            takes_value=entry["takes_value"],
            choices=tuple(entry["choices"]) if entry["choices"] is not None else None,
            type=entry["type"],
        )
        for entry in raw["options"]
    ]
    return CliTable(raw["name"], raw["version"], options)


def sglang_table() -> CliTable:
    return load_table("sglang", versions.SGLANG)


def router_table(kind: str = "rust") -> CliTable:
    """The router's table: smg's for the rust router, sglang-router's for MiniLB."""
    if kind == "mini-lb":
        return load_table("sglang-router", versions.SGLANG_ROUTER)
    return load_table("smg", versions.SMG)
