"""JSON that is safe to serve: nesting within a bound, and text that is valid Unicode.

JSON itself allows both of what breaks the layers after parsing. Nesting a thousand levels deep makes
Python's json, pydantic and Jinja's tojson recurse until RecursionError; a lone UTF-16 surrogate such as
"\\ud800" parses into a Python string that no UTF-8 encoder (the tokenizer, a log stream) accepts. Both are
refused here, with the place they were found, before anything else touches the value.
"""
from __future__ import annotations

import json
import re
from typing import Any

from sluice_contracts.json_depth import MAX_JSON_DEPTH

_SURROGATE = re.compile("[\ud800-\udfff]")
# Only text with an escaped surrogate (\uD800-\uDFFF, paired or not) can parse into one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class UnsafeJSON(ValueError):
    """JSON that parses but cannot be served; `path` is where, as 'messages[0].content' (None: the top)."""

    def __init__(self, message: str, path: str | None, code: str):
        super().__init__(message)
        self.path = path
        self.code = code


def loads(text: str) -> Any:
    """json.loads, raising json.JSONDecodeError for what is not JSON and UnsafeJSON for what cannot be served."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(None) from None
    # Walking a large value costs more than parsing it; text with few brackets and no escaped surrogate
    # cannot hold what the walk looks for.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(text):
        check(value)
    return value


def check(value: Any) -> None:
    """Raise UnsafeJSON for the first container nested too deep or string holding a lone surrogate."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise UnsafeJSON(f"The text at {_where(path)} holds a lone UTF-16 surrogate, which is not valid "
                                 "Unicode; send UTF-8 text or surrogate pairs.", _name(path), "invalid_unicode")
            continue
        if len(path) >= MAX_JSON_DEPTH:
            raise _too_deep(_name(path))
        entries = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for key, child in entries:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise UnsafeJSON(f"A key at {_where(path)} holds a lone UTF-16 surrogate, which is not valid "
                                 "Unicode.", _name(path), "invalid_unicode")
            if isinstance(child, (str, list, dict)):
                stack.append((child, (*path, key)))


def _too_deep(path: str | None) -> UnsafeJSON:
    return UnsafeJSON(f"The JSON nests arrays and objects more than {MAX_JSON_DEPTH} levels deep.", path,
                      "json_too_deep")


def _name(path: tuple) -> str | None:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _where(path: tuple) -> str:
    name = _name(path)
    return f"'{name}'" if name else "the top level"
