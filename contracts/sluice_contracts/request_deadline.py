"""How long a request may wait for the first byte of its answer: its budget, where it comes from, and its bounds.

A runtime admits a request only when it expects to send the first byte of the answer within the budget: the first
token of a stream, the whole body of a response read at once. It refuses one it cannot serve in time at once (503,
`DEADLINE_UNATTAINABLE`, with Retry-After), and ends one whose budget passes while it is still queued (503,
`DEADLINE_PASSED`): a client that has given up is not served late, and one that has not learns at once.

The budget is taken from the first of these that holds a valid value:

1. the client's own timeout, in seconds, from the first of `CLIENT_TIMEOUT_HEADERS` that is present: the official
   OpenAI Python client sends its read timeout as `x-stainless-read-timeout` (600 unless `timeout=` says
   otherwise); the other Stainless SDKs send `x-stainless-timeout`; `x-request-timeout` and `timeout` are read for
   other clients;
2. `BUDGET_HEADER`, which the gateway sends with what is left of the request's budget when it forwards it (it
   removes the client's timeout headers then, as it replaces the priority headers);
3. the default of the request's priority class, `CLASS_BUDGET_S` (critical short: refused soon, so it can go
   elsewhere; batch long: it may wait);
4. the runtime's own default (`--default-budget-s`).

A value that is not a number of seconds in (0, MAX_BUDGET_S], or a header given more than once, is ignored (the
runtime logs it) and the next source is read: a bad timeout never fails a request. The budget only decides whether a
request is admitted and how long it may queue; it never moves a request ahead of another (priority does that).
"""
from __future__ import annotations

import math
import re

from .request_priority import DEFAULT_CLASSES, in_batch_class

CLIENT_TIMEOUT_HEADERS = ("x-stainless-read-timeout", "x-stainless-timeout", "x-request-timeout", "timeout")
BUDGET_HEADER = "x-sluice-budget-s"

# A day: longer than any request timeout; a larger value is taken as a mistake, not as "forever".
MAX_BUDGET_S = 86400.0

# The budgets of the priority classes that have one (the class numbers are request_priority.DEFAULT_CLASSES); a
# request between them gets the runtime's default.
CLASS_BUDGET_S = {"critical": 10.0, "batch": 600.0}

# The OpenAI error codes of the two refusals.
DEADLINE_UNATTAINABLE = "deadline_unattainable"
DEADLINE_PASSED = "deadline_passed"

# A plain decimal or exponent number, as clients print floats ("600.0", "1e-05"): no sign, nan, inf or hex.
_SECONDS = re.compile(r"^\s*[0-9]{1,20}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,3})?\s*$")


class InvalidBudget(ValueError):
    """A timeout or budget header that cannot be used; the message names it."""


def parse_seconds(header: str, values: list[str]) -> float:
    """The one value of `header` as seconds, or InvalidBudget saying why not."""
    if len(values) != 1:
        raise InvalidBudget(f"the {header} header is given {len(values)} times; it must be given once")
    text = values[0]
    seconds = float(text) if _SECONDS.match(text) else math.nan
    if not 0 < seconds <= MAX_BUDGET_S:
        raise InvalidBudget(f"the {header} header must be a number of seconds above 0 and at most "
                            f"{MAX_BUDGET_S:g}, got {text[:32]!r}")
    return seconds


def header_value(seconds: float) -> str:
    """The budget as the gateway sends it: milliseconds' precision, within the bounds the runtime accepts."""
    return f"{min(max(seconds, 0.001), MAX_BUDGET_S):.3f}"


def class_budget(priority: int) -> float | None:
    """The budget of the class `priority` falls in (critical's number or more urgent, batch's or less urgent)."""
    if priority <= DEFAULT_CLASSES["critical"]:
        return CLASS_BUDGET_S["critical"]
    if in_batch_class(priority):
        return CLASS_BUDGET_S["batch"]
    return None
