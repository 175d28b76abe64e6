"""What to load and unload on one replica so that its adapters are the declared ones. No I/O."""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Literal, Mapping


@dataclass(frozen=True)
class Step:
    action: Literal["load", "unload"]
    name: str
    path: str = ""


def _moved(loaded_path: str | None, wanted_path: str) -> bool:
    """A runtime that does not say where an adapter came from is taken at its word that it is the one named."""
    return loaded_path is not None and posixpath.normpath(loaded_path) != posixpath.normpath(wanted_path)


def plan(wanted: Mapping[str, str], loaded: Mapping[str, str | None]) -> list[Step]:
    """`wanted`: adapter → path; `loaded`: adapter → the path the replica loaded it from (None: not said).
    Unloads first (no longer declared, or declared from another path), then loads, each in name order."""
    steps = [Step("unload", name) for name in sorted(loaded)
             if name not in wanted or _moved(loaded[name], wanted[name])]
    steps += [Step("load", name, wanted[name]) for name in sorted(wanted)
              if name not in loaded or _moved(loaded[name], wanted[name])]
    return steps
