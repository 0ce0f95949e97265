"""pydantic's errors in the operator's words: the key, the value as written, why, and the fix."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .base import CONFIG_NAMESPACE
from .cluster_config import ClusterConfig
from .grammars import did_you_mean


def location_key(loc: tuple[Any, ...]) -> str:
    # pydantic locates a bad mapping key as (..., KEY, "[key]"): name the mapping holding it.
    if len(loc) >= 2 and loc[-1] == "[key]":
        loc = loc[:-2]
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def shown_value(value: Any) -> str:
    """VALUE as the stack file wrote it (the repr of what YAML read); never a private key."""
    text = repr(value)
    if "PRIVATE KEY" in text:
        return "<a private key, not shown>"
    return text if len(text) <= 200 else text[:200] + "..."


def _step(annotation: Any, part: Any) -> Any:
    """The type one location part further into ANNOTATION (a model, list, dict or optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    origin = get_origin(annotation)
    if origin is list and isinstance(part, int):
        return args[0]
    if origin is dict and isinstance(part, str):
        return args[1]
    if origin in (Union, UnionType) and len(args) == 1:
        return _step(args[0], part)
    return None


def _model_at(loc: tuple[Any, ...],
              root: type[BaseModel] = ClusterConfig) -> type[BaseModel] | None:
    """The model whose value sits at LOC (ROOT at ()), if it is one."""
    annotation: Any = root
    for part in loc:
        annotation = _step(annotation, part)
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        annotation = args[0]
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


def _field_at(loc: tuple[Any, ...], root: type[BaseModel] = ClusterConfig,
              ) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model holding the key at LOC and that key's field, as far as they can be found."""
    owner = _model_at(loc[:-1], root)
    if owner is None or not loc:
        return owner, None
    field = next((f for name, f in owner.model_fields.items() if loc[-1] in (name, f.alias)), None)
    return owner, field


def _keys_of(model: type[BaseModel] | None) -> str:
    """` (its keys: a, b)` for a model, else nothing."""
    if model is None:
        return ""
    return f" (its keys: {', '.join(f.alias or n for n, f in model.model_fields.items())})"


def _example(loc: tuple[Any, ...], field: FieldInfo | None) -> str:
    default = getattr(field, "default", None)
    if default is None or default is PydanticUndefined or isinstance(default, BaseModel):
        return ""
    return f", e.g. {loc[-1]}: {json.dumps(default)}"


# YAML 1.1 (PyYAML, and Pulumi's stack files) reads these unquoted words as booleans.
_YAML_BOOLEAN = "YAML reads an unquoted yes/no/on/off/true/false as a boolean"


def _cli_string(namespace: str, key: str, value: str) -> str:
    """The `pulumi config set` that stores VALUE at KEY as a string: with `--path` alone the CLI
    stores an integer, true or false as a number or a boolean (`--type`: pulumi/pulumi#18287,
    in the CLI since early 2025; the pinned 3.272 has it)."""
    return (f"pulumi config set --path --type string {shlex.quote(f'{namespace}:{key}')} "
            f"{shlex.quote(value)}")


def type_problem(key: str, item: Mapping[str, Any], root: type[BaseModel] = ClusterConfig,
                 namespace: str = CONFIG_NAMESPACE) -> str:
    """One pydantic error as KEY: VALUE-AS-WRITTEN, why, and the fix (ROOT: the stack's model,
    NAMESPACE: its config namespace, for the CLI form of a fix)."""
    kind, value, ctx = item["type"], item.get("input"), item.get("ctx") or {}
    loc = tuple(item["loc"])
    shown = shown_value(value)
    model, field = _field_at(loc, root) if loc else (None, None)
    if kind == "extra_forbidden":
        keys = [f.alias or n for n, f in model.model_fields.items()] if model is not None else []
        where = location_key(loc[:-1]) or "the stack"
        suggestion = did_you_mean(str(loc[-1]), keys)
        listed = f" ({where}'s keys: {', '.join(keys)})" if keys else ""
        return (f"{key}: unknown key (value {shown}), so the program would never read it"
                f"{suggestion}: rename or remove it{listed}.")
    if kind == "missing":
        keys = _keys_of(_model_at(loc, root))
        return f"{key}: required key is missing; set it in the stack file{keys}."
    if kind in ("int_type", "int_parsing", "int_from_float", "int_parsing_size"):
        return (f"{key}: {shown} is not a whole number; write a plain integer, without quotes, "
                f"units or decimals{_example(loc, field)}.")
    if kind in ("float_type", "float_parsing"):
        return f"{key}: {shown} is not a number; write a plain number without quotes, e.g. 0.5."
    if kind in ("bool_type", "bool_parsing"):
        return f"{key}: {shown} is not true or false; write true or false, without quotes."
    if kind == "string_type":
        if isinstance(value, bool):
            word = json.dumps(value)
            return (f"{key}: {shown} is a boolean, not a string ({_YAML_BOOLEAN}): put the word "
                    f"in quotes, e.g. \"no\"; from the CLI: {_cli_string(namespace, key, word)}.")
        if isinstance(value, (int, float)):
            return (f"{key}: {shown} is a number, not a string: put it in quotes, \"{value}\"; "
                    f"from the CLI: {_cli_string(namespace, key, str(value))}.")
        return f"{key}: {shown} is not a string; write a single (quoted) string."
    if kind == "list_type":
        example = f"[{value}]" if isinstance(value, (str, int, float)) else "[a, b]"
        return (f"{key}: {shown} is not a list; write a YAML list, e.g. {example} (one item is "
                "still a list).")
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return (f"{key}: {shown} is not a mapping; write `key: value` lines under it"
                f"{_keys_of(_model_at(loc, root))}.")
    if kind in ("literal_error", "enum"):
        hint = f" ({_YAML_BOOLEAN})" if isinstance(value, bool) else ""
        quoted = " in quotes" if isinstance(value, bool) else ""
        return (f"{key}: {shown} is not one of {ctx.get('expected')}{hint}; write one of "
                f"them{quoted}.")
    bounds = {"greater_than_equal": ("ge", "is below the minimum {}", "set it to {} or more"),
              "greater_than": ("gt", "is not above {}", "set it above {}"),
              "less_than_equal": ("le", "is above the maximum {}", "set it to {} or less"),
              "less_than": ("lt", "is not below {}", "set it below {}")}
    if kind in bounds:
        name, why, fix = bounds[kind]
        return f"{key}: {shown} {why.format(ctx.get(name))}; {fix.format(ctx.get(name))}."
    if kind == "too_short":
        return (f"{key}: {shown} has {ctx.get('actual_length')} item(s), and at least "
                f"{ctx.get('min_length')} is needed; add one.")
    if kind == "too_long":
        return (f"{key}: {shown} has {ctx.get('actual_length')} items, at most "
                f"{ctx.get('max_length')} are allowed; remove some.")
    return (f"{key}: {shown} is refused ({item['msg']}); write the type Pulumi.yaml documents "
            f"for {key}.")


def validation_problems(error: ValidationError, root: type[BaseModel] = ClusterConfig,
                        namespace: str = CONFIG_NAMESPACE) -> list[str]:
    """Every problem pydantic found in a stack's values (ROOT: its model, NAMESPACE: its config
    namespace), one line each, as KEY: what is wrong and the fix."""
    lines = []
    for item in error.errors():
        key = location_key(item["loc"])
        if item["type"] == "value_error":
            for line in str(item.get("ctx", {}).get("error", item["msg"])).splitlines():
                lines.append(f"{key}: {line}" if key and not line.startswith(key) else line)
        else:
            lines.append(type_problem(key, item, root, namespace))
    return lines
