"""Dataclass fields that are also command-line flags: each default and help text is written once, on the field.

`EngineConfig` and `ServerSettings` declare their fields with `flag(...)`; `add_flags` turns those fields into
argparse options and `from_flags` builds the dataclass back from the parsed namespace, so the CLI cannot drift
from the defaults a Python caller gets. Values the dataclass parses itself (memory sizes, 'auto'/'off') reach it
as text, so a bad one is refused with the dataclass's own message.
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class FlagSpec:
    help: str | None
    parse: Callable[[str], Any] | None
    choices: tuple | None
    option: str | None  # the option's name when it is not --field-name
    metavar: str | None
    nargs: str | None
    repeatable: bool  # each use of the option adds one value to a list


def flag(default: Any = MISSING, help: str | None = None, *, default_factory: Callable[[], Any] | Any = MISSING,
         parse: Callable[[str], Any] | None = None, choices: tuple | None = None, option: str | None = None,
         metavar: str | None = None, nargs: str | None = None, repeatable: bool = False) -> Any:
    """A dataclass field with its flag. A boolean defaulting to True becomes a `--no-…` switch (name it in `option`)."""
    spec = FlagSpec(help, parse, choices, option, metavar, nargs, repeatable)
    return field(default=default, default_factory=default_factory, metadata={"flag": spec})


def add_flags(parser: argparse.ArgumentParser, title: str, cls: type) -> None:
    """`cls`'s flags, in a group of the help named `title`."""
    group = parser.add_argument_group(title)
    for f in fields(cls):
        spec: FlagSpec | None = f.metadata.get("flag")
        if spec is None:
            continue
        default = f.default_factory() if f.default is MISSING else f.default
        option = spec.option or "--" + f.name.replace("_", "-")
        if isinstance(default, bool):
            group.add_argument(option, dest=f.name, default=default, help=spec.help,
                               action="store_false" if default else "store_true")
            continue
        parse = spec.parse
        if parse is None and type(default) in (int, float):
            parse = type(default)
        group.add_argument(option, dest=f.name, default=default, type=parse, choices=spec.choices,
                           metavar=spec.metavar, nargs=spec.nargs, help=spec.help,
                           action="append" if spec.repeatable else "store")


def from_flags(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass from parsed flags; argparse shares a list default between parses, so lists are copied."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if "flag" in f.metadata}
    return cls(**{name: list(v) if isinstance(v, list) else v for name, v in values.items()})
