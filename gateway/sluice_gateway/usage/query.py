"""The parameters of `GET /v1/usage`, checked: each bad one is a 400 naming it, in OpenAI's error shape."""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

from ..errors import GatewayError

GROUPS = ("tenant", "model", "mode", "kind")
FORMATS = ("json", "csv")
# A month of hours at most in one answer: a bill's period, and a bounded read (one hash per hour).
MAX_SPAN_S = 31 * 24 * 3600
_PARAMETERS = ("start", "end", "group_by", "format")
_UNIX_S = re.compile(r"^[0-9]{1,12}$")


@dataclass(frozen=True, slots=True)
class UsageQuery:
    start: int
    end: int
    group_by: tuple[str, ...]
    format: str


def parse_query(query_string: bytes, now: float) -> UsageQuery:
    """`end` defaults to now; `group_by` to none (one row of totals); `format` to json."""
    given: dict[str, str] = {}
    for name, value in parse_qsl(query_string.decode("utf-8", errors="replace"), keep_blank_values=True):
        if name not in _PARAMETERS:
            raise _bad(f"unknown parameter {name[:64]!r}; the parameters are {', '.join(_PARAMETERS)}", name[:64],
                       "unknown_parameter")
        if name in given:
            raise _bad(f"{name} is given twice", name)
        given[name] = value
    if "start" not in given:
        raise _bad("start is required: the range's first second, in unix seconds", "start",
                   "missing_required_parameter")
    start = _unix_s(given, "start")
    end = _unix_s(given, "end") if "end" in given else int(now) + 1
    if end <= start:
        raise _bad(f"end ({end}) must be after start ({start})", "end")
    if end - start > MAX_SPAN_S:
        raise _bad(f"the range is {end - start} s; at most {MAX_SPAN_S} s (31 days) may be read at once", "end")
    groups = tuple(dict.fromkeys(name for name in given.get("group_by", "").split(",") if name))
    if unknown := [name for name in groups if name not in GROUPS]:
        raise _bad(f"group_by may name {', '.join(GROUPS)}; not {unknown[0][:64]!r}", "group_by")
    output = given.get("format", "json")
    if output not in FORMATS:
        raise _bad(f"format is json or csv, not {output[:64]!r}", "format")
    return UsageQuery(start, end, groups, output)


def _unix_s(given: dict[str, str], name: str) -> int:
    value = given[name]
    if not _UNIX_S.match(value):
        raise _bad(f"{name} must be a whole number of unix seconds, not {value[:64]!r}", name)
    return int(value)


def _bad(message: str, param: str, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)
