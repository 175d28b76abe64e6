"""The short, bounded wait of requests less urgent than the default priority class while every replica that could
serve them is saturated (its engine queues requests).

Such a request waits for a load poll that shows a replica with nothing queued, at most `priority.hold_s`; with
`priority.max_held` already waiting for its model, or its tenant's fair share of them (fair_holds.py), or past
the wait, it gets 503 with Retry-After (`saturated`) and is not forwarded, so the replicas' queues stay for the
more urgent classes. A held request whose client leaves is dropped like any other (app.py cancels it). A request
whose budget (budget.py) runs out first gets the 503 then, with the code `deadline_passed`. Requests of the
default class or more urgent ones never wait here.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from .auth import Rank
from .budget import budget_passed
from .config import Priority
from .errors import GatewayError
from .fair_holds import FairHolds
from .metrics import GatewayMetrics
from .picker import Picker
from .request_context import Outcome
from .request_spans import NO_SPANS


class PriorityHold:
    def __init__(self, picker: Picker, metrics: GatewayMetrics) -> None:
        self._picker = picker
        self._metrics = metrics
        self._held = FairHolds()

    async def wait(self, rank: Rank, settings: Priority, saturated: Callable[[], bool], *, model: str,
                   tenant: str, budget_left: Callable[[], float | None] = lambda: None,
                   outcome: Outcome | None = None, spans=NO_SPANS) -> None:
        """Returns once the request may be forwarded; raises the 503 it gets otherwise (at once when its budget,
        `budget_left` seconds, runs out first). A wait is added to the `outcome`'s held time, forwarded or not,
        and is a span of the request's `spans` (request_spans.py)."""
        if rank.urgency <= 0 or not saturated():
            return
        if settings.hold_s == 0:
            self._shed(rank, settings, "is not held")
        reason = self._held.refusal(model, tenant, settings.max_held)
        if reason is not None:
            self._shed(rank, settings, "could not wait: the hold for this model is full" if reason == "full" else
                       "could not wait: your requests already take your share of the hold for this model")
        loop = asyncio.get_running_loop()
        left = budget_left()
        deadline = loop.time() + settings.hold_s
        budget_deadline = math.inf if left is None else loop.time() + left
        held = self._metrics.priority_held.labels(rank.priority_class)
        self._held.add(model, tenant)
        held.inc()
        started = loop.time()
        span = spans.step("priority hold")
        try:
            while saturated():
                now = loop.time()
                if budget_deadline <= now:
                    self._metrics.priority_shed.labels(rank.priority_class).inc()
                    raise budget_passed("every replica of this model was saturated", _retry_after(settings))
                remaining = deadline - now
                if remaining <= 0:
                    self._shed(rank, settings, f"did not get one within {settings.hold_s:g} s")
                await self._picker.next_poll(min(remaining, budget_deadline - now))
        finally:
            self._held.remove(model, tenant)
            held.dec()
            if outcome is not None:
                outcome.held_s = (outcome.held_s or 0.0) + loop.time() - started
            if span.is_recording():
                span.set_attributes({"sluice.priority_class": rank.priority_class,
                                     "sluice.hold.wait_ms": round((loop.time() - started) * 1000, 3)})
            span.end()

    def _shed(self, rank: Rank, settings: Priority, what: str) -> None:
        self._metrics.priority_shed.labels(rank.priority_class).inc()
        retry_after = _retry_after(settings)
        raise GatewayError(
            503, f"every replica of this model is saturated and this request of the priority class "
                 f"{rank.priority_class!r} {what}; retry later",
            code="saturated", headers=[(b"retry-after", str(retry_after).encode())],
        )


def _retry_after(settings: Priority) -> int:
    return max(1, math.ceil(settings.hold_s))
