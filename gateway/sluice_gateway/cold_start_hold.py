"""Holding a request for a model that has no endpoint yet (scaled to zero, or starting) until one is ready.

The number held per model is the demand signal (sluice_contracts.demand): the operator reads it from the
gateway's metrics and starts a replica, whose endpoint reaches the routing table; the table update wakes the
held requests, which are then forwarded as any other. While it waits, a streaming request gets an SSE comment
line every `keepalive_s` (its response headers go out when the hold starts), so clients and proxies do not time
out; a non-streaming one gets nothing until the answer.

Bounded per model (`max_held_per_model`, a tenant at most its fair share of it: fair_holds.py) and in time
(`max_wait_s`, or the request's own budget, budget.py, when that ends first): past either the client gets 503
with Retry-After (`model_starting`; `deadline_passed` for the budget), and so do the held requests of a gateway
that is stopping. A stream whose headers are already out gets the same error as its last event. A held request
whose client leaves is cancelled, and so leaves the hold.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from sluice_contracts import request_deadline as contract

from .budget import budget_passed
from .config import ColdStart
from .errors import GatewayError
from .fair_holds import FairHolds
from .metrics import GatewayMetrics
from .relay import Send
from .request_context import RequestContext

KEEPALIVE = b": waiting for model to start\n\n"


class ColdStartHold:
    def __init__(self, settings: ColdStart, metrics: GatewayMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._held = FairHolds()
        self._changed = asyncio.Event()
        self._closing = False

    def held(self, model: str) -> int:
        return self._held.held(model)

    def table_changed(self) -> None:
        """A new routing table: every held request looks again for an endpoint."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        """The gateway is stopping: held requests, and any that would be held from now on, get 503."""
        self._closing = True
        self.table_changed()

    async def wait(self, ctx: RequestContext, models: tuple[str, ...], ready: Callable[[], bool], send: Send) -> None:
        """Return once `ready()` (one of `models` has an endpoint); else raise the 503 the client gets."""
        settings = self._settings
        if self._closing:
            raise self._refusal(models, "the gateway is shutting down; retry to reach another replica")
        limit, tenant = settings.max_held_per_model, ctx.tenant
        for model in models:
            reason = self._held.refusal(model, tenant, limit)
            if reason is not None:
                self._metrics.hold_refusals.labels(model, reason).inc()
                why = ("this gateway holds no request while a model starts" if not limit
                       else f"{limit} requests are already waiting for it" if reason == "full"
                       else "your requests already take your share of the requests waiting for it")
                raise self._refusal(models, why)
        for model in models:
            self._held.add(model, tenant)
            self._metrics.held_requests.labels(model).set(self._held.held(model))
        started = time.perf_counter()
        outcome = "client_left"
        try:
            await self._until_ready(ctx, models, ready, send)
            outcome = "forwarded"
        except GatewayError as err:
            outcome = ("shutdown" if self._closing else "deadline" if err.code == contract.DEADLINE_PASSED
                       else "timeout")
            self._metrics.hold_refusals.labels(models[0], outcome).inc()
            raise err
        finally:
            for model in models:
                self._held.remove(model, tenant)
                self._metrics.held_requests.labels(model).set(self._held.held(model))
            ctx.outcome.held_s = time.perf_counter() - started
            self._metrics.hold_seconds.labels(models[0], outcome).observe(ctx.outcome.held_s)

    async def _until_ready(
        self, ctx: RequestContext, models: tuple[str, ...], ready: Callable[[], bool], send: Send,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.max_wait_s
        left = ctx.budget_left()
        budget_deadline = math.inf if left is None else loop.time() + left
        if ctx.stream:
            await _start_stream(ctx, send)
        while not ready():
            if self._closing:
                raise self._refusal(models, "the gateway is shutting down; retry to reach another replica")
            now = loop.time()
            if budget_deadline <= now:
                raise budget_passed(f"the model '{models[0]}' was starting", self._settings.retry_after_s)
            left = deadline - now
            if left <= 0:
                raise self._refusal(models, f"it did not start within {self._settings.max_wait_s:g} s")
            changed = self._changed
            try:
                async with asyncio.timeout(min(left, budget_deadline - now, self._settings.keepalive_s)):
                    await changed.wait()
            except TimeoutError:
                if ctx.stream:
                    await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})

    def _refusal(self, models: tuple[str, ...], why: str) -> GatewayError:
        retry_after = self._settings.retry_after_s
        return GatewayError(
            503, f"The model '{models[0]}' is starting (scaled to zero); {why}. Retry after {retry_after} s.",
            code="model_starting", headers=[(b"retry-after", str(retry_after).encode())],
        )


async def _start_stream(ctx: RequestContext, send: Send) -> None:
    """The stream's headers and a first comment now: the client knows at once that it is held, not lost."""
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
        *ctx.response_headers,
    ]})
    await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
