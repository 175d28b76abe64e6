"""The reference tables the READMEs carry, generated from the code or the benchmark results that own each fact.

Each table sits in its document between `<!-- generated:NAME -->` and `<!-- end generated:NAME -->`. `make docs`
rewrites them; `stale()` names those that differ from what the code says now, which a test checks.
"""
from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from docs import bench_tables

ROOT = Path(__file__).resolve().parent.parent


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _ranges() -> dict[str, str]:
    """Each bounded flag's range, from the limits the runtime and the CRD share (`--max-num-seqs`: 1 to 4096)."""
    from sluice_contracts import runtime_flags

    return {"--" + v.name.replace(" ", "-"): f"{v.minimum} to {v.maximum}"
            for v in vars(runtime_flags).values() if isinstance(v, runtime_flags.IntRange)}


def _flag_table(title: str, add_cli_args: Callable[[argparse.ArgumentParser], None]) -> str:
    ranges = _ranges()
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    rows = ["| flag | default | meaning |", "| --- | --- | --- |"]
    for group in parser._action_groups:
        if group.title != title:
            continue
        for action in group._group_actions:
            option = action.option_strings[0]
            if action.metavar:
                option += f" {action.metavar}"
            switch = isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction)
            default = "" if switch or action.default in (None, []) else f"`{action.default}`"
            meaning = action.help or ""
            if action.choices:
                meaning += f" (one of {', '.join(f'`{c}`' for c in action.choices)})"
            if action.option_strings[0] in ranges:
                meaning += f" ({ranges[action.option_strings[0]]})"
            rows.append(f"| `{_cell(option)}` | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(rows)


def engine_flags() -> str:
    from sluice_runtime.engine_config import EngineConfig

    return _flag_table("engine", EngineConfig.add_cli_args)


def server_flags() -> str:
    from sluice_runtime.server.settings import ServerSettings

    return _flag_table("server", ServerSettings.add_cli_args)


def _model_of(annotation: object) -> tuple[type[BaseModel] | None, str]:
    """The settings model a field holds (alone, optional, or as a list of them), and the key's suffix."""
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    if typing.get_origin(annotation) is tuple and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "[]"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0], ""
    return None, ""


def _type_name(annotation: object) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " or ".join(f"`{value}`" for value in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args)
    if origin in (tuple, list):
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if annotation is type(None):
        return "null"
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "Path": "path"}.get(
        getattr(annotation, "__name__", ""), str(annotation))


def _config_rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested, suffix = _model_of(field.annotation)
        if nested is not None:
            optional = " (omitted: off)" if field.default is None else ""
            meaning = field.description or " ".join((nested.__doc__ or "").split())
            rows.append(f"| `{key}{suffix}` | section{optional} | | {_cell(meaning)} |")
            rows += _config_rows(nested, f"{key}{suffix}.")
            continue
        if field.default_factory is not None:
            default = f"`{field.default_factory()}`"  # type: ignore[call-arg]
        elif field.default is PydanticUndefined:
            default = "required"
        else:
            default = "" if field.default in (None, ()) else f"`{field.default}`"
        rows.append(f"| `{key}` | {_cell(_type_name(field.annotation))} | {_cell(default)} | "
                    f"{_cell(field.description or '')} |")
    return rows


def gateway_config() -> str:
    from sluice_gateway.config import GatewayConfig

    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    return "\n".join(rows + _config_rows(GatewayConfig, ""))


# Document -> the tables it carries.
TABLES: dict[str, dict[str, Callable[[], str]]] = {
    "runtime/README.md": {"engine-flags": engine_flags, "server-flags": server_flags},
    "gateway/README.md": {"gateway-config": gateway_config},
    "bench/README.md": bench_tables.TABLES,
}


def _replace(text: str, name: str, table: str) -> str:
    pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- end generated:{name} -->)", re.S)
    if not pattern.search(text):
        raise LookupError(f"no <!-- generated:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)


def rendered() -> dict[Path, tuple[str, str]]:
    """Each document: its text now, and its text with every table generated afresh."""
    out = {}
    for document, tables in TABLES.items():
        path = ROOT / document
        text = path.read_text()
        new = text
        for name, build in tables.items():
            new = _replace(new, name, build())
        out[path] = (text, new)
    return out


def stale() -> list[str]:
    return [str(path.relative_to(ROOT)) for path, (old, new) in rendered().items() if old != new]


def main() -> None:
    for path, (old, new) in rendered().items():
        if old != new:
            path.write_text(new)
            print(f"rewrote {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
