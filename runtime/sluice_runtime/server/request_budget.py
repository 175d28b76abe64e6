"""A request's budget (sluice_contracts.request_deadline), read from its headers.

The value travels from the route, where the headers are, to the submission in generation.py in the request's own
context (`BUDGET`, set by `apply_budget`): one request's budget is never seen by another's task.

A timeout the client states (directly, or through the gateway's header) covers its whole answer, so a response read
at once must be generated within it too. A default (the class's, the runtime's) only bounds how long a request may
queue for its first token: a long answer the client did not time is not refused for its length.
"""
from __future__ import annotations

import contextvars
import logging

from sluice_contracts import request_deadline as contract

log = logging.getLogger("sluice.server")

# The budget of the request the current task serves, in seconds (None: the runtime's default, --default-budget-s),
# and whether the client stated it (it then covers the whole answer).
BUDGET: contextvars.ContextVar[tuple[float | None, bool]] = contextvars.ContextVar("sluice_budget_s",
                                                                                   default=(None, False))


def read_budget(headers, priority: int) -> tuple[float | None, str]:
    """The budget in seconds and where it came from (a header's name, or `class`): the first valid header of the
    contract's order, else the priority class's; (None, `default`) when neither gives one, and the runtime's
    default applies. `headers`: Starlette's (getlist)."""
    for header in contract.CLIENT_TIMEOUT_HEADERS + (contract.BUDGET_HEADER,):
        values = headers.getlist(header)
        if not values:
            continue
        try:
            return contract.parse_seconds(header, values), header
        except contract.InvalidBudget as exc:
            log.warning("budget header ignored: %s", exc)
    budget = contract.class_budget(priority)
    return budget, "class" if budget is not None else "default"


def apply_budget(headers, priority: int) -> None:
    """Reads the request's budget and makes it the current task's (BUDGET)."""
    budget, source = read_budget(headers, priority)
    BUDGET.set((budget, source not in ("class", "default")))
