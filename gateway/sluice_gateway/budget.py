"""A request's budget at the gateway (sluice_contracts.request_deadline): how long its client waits for the first
byte of the answer, read from the client's own timeout header when the request arrives.

What is left of it bounds the holds (cold start, priority), picks replicas whose estimated queue fits, decides
whether a refused request is tried on another endpoint, and goes upstream in the contract's BUDGET_HEADER. A
request whose client states no timeout has no budget here; the runtime then applies its priority class's default
itself. The budget never changes a request's priority: that is the tenant's, from gateway.yaml.
"""
from __future__ import annotations

import logging

from sluice_contracts import request_deadline as contract

from .errors import GatewayError

log = logging.getLogger("sluice_gateway")

_HEADERS = tuple((name, name.encode()) for name in contract.CLIENT_TIMEOUT_HEADERS)


def client_budget(headers: list[tuple[bytes, bytes]]) -> float | None:
    """The first valid client timeout of the contract's order, in seconds; None when none is given. A bad value
    (or one given more than once) is logged and the next header read, as the runtime does."""
    for name, raw in _HEADERS:
        values = [value.decode("latin-1") for key, value in headers if key == raw]
        if not values:
            continue
        try:
            return contract.parse_seconds(name, values)
        except contract.InvalidBudget as exc:
            log.warning("budget header ignored: %s", exc)
    return None


def budget_passed(where: str, retry_after_s: int) -> GatewayError:
    """The 503 of a request whose budget ran out in the gateway (`where`: what it was waiting for)."""
    return GatewayError(
        503, f"the request's time budget (its client's timeout) ran out while {where}; retry after "
             f"{retry_after_s} s", code=contract.DEADLINE_PASSED,
        headers=[(b"retry-after", str(retry_after_s).encode())],
    )
