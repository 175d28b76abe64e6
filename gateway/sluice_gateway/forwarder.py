"""Forwarding one request upstream: the picker's endpoints tried in order until one answers, whose response
is then relayed to the client (relay.py).

Retries happen only until an upstream has answered with headers; after that the response is the client's.
A first-byte timeout is final: the wait already used the client's patience, and another endpoint would start
the whole generation again.

Upstreams get the runtime credential, never the client's key. A runtime that refuses it (401) gets the same
request once more with the credential's other value, if it has one (upstream_credential.py: a rotation seen by
one side and not yet by the other). They also get the tenant's priority, name and share in the headers of
sluice_contracts.request_priority, from gateway.yaml, whatever the client sent, and what is left of the request's
budget (budget.py) in the header of sluice_contracts.request_deadline, never the client's own timeout headers.

Each attempt carries the client's trace (sluice_contracts.trace_context) under a span id of its own: with tracing
on, that of the attempt's span (request_spans.py), which lasts until its answer is relayed. The backend that answers names
its model version on the answer (version_stamp.py).

A runtime's refusal for a budget it cannot meet (or one that passed while queued) is tried on the next endpoint
only while some of the budget is left; the client gets the last refusal as the runtime sent it (its code and
Retry-After).
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from itertools import islice

from opentelemetry.trace import SpanKind

from sluice_contracts import prompt_reservation, request_deadline, request_priority, runtime_credential
from sluice_contracts.model_version import HEADER as VERSION_HEADER
from sluice_contracts.model_version import PATTERN, fingerprint
from sluice_contracts.trace_context import TraceContext

from .budget import budget_passed
from .config import Timeouts
from .connection_pool import ConnectionPool, UpstreamError, UpstreamResponse
from .errors import GatewayError
from .metrics import GatewayMetrics
from .picker import Attempt, Picker
from .relay import ResponseRelay, Send, upstream_code, upstream_message
from .request import serialise
from .request_context import RequestContext
from .upstream_credential import UpstreamCredential
from .version_stamp import field

_RETRY_STATUSES = {500, 502, 503, 504}
_MAX_ERROR_BODY = 64 * 1024  # of an upstream error, only the message is passed on
# The codes of upstream refusals the client gets as they are: what they say (a budget) is the client's own.
_PASSED_ON_CODES = frozenset({request_deadline.DEADLINE_UNATTAINABLE, request_deadline.DEADLINE_PASSED})
_VERSION_HEADER = VERSION_HEADER.encode()
_VERSION = re.compile(PATTERN)
_FINGERPRINTED = frozenset({"chat", "completion"})  # the tasks whose answers carry OpenAI's system_fingerprint


class Forwarder:
    def __init__(
        self, timeouts: Timeouts, picker: Picker, metrics: GatewayMetrics, *, credential: UpstreamCredential,
        max_response_bytes: int, max_held_response_bytes: int,
    ) -> None:
        self._timeouts = timeouts
        self._picker = picker
        self._metrics = metrics
        self._credential = credential
        self._relay = ResponseRelay(timeouts, metrics, max_response_bytes, max_held_response_bytes)
        self.pool = ConnectionPool(timeouts.connect_s)

    def close(self) -> None:
        self.pool.close()

    async def forward(self, ctx: RequestContext, attempts: Iterator[Attempt], max_attempts: int, send: Send) -> None:
        """Answer the request from the first endpoint that takes it; else raise the error the client gets."""
        deadline = asyncio.get_running_loop().time() + self._timeouts.total_s
        last_refusal: GatewayError | None = None
        for attempt in islice(attempts, max_attempts):
            left = ctx.budget_left()
            if left is not None and left <= 0:
                raise last_refusal or budget_passed("the gateway read and admitted it", 1)
            attempt.endpoint.in_flight += 1
            backend_in_flight = self._metrics.backend_in_flight.labels(attempt.backend.name)
            backend_in_flight.inc()
            span = ctx.spans.step("upstream attempt", SpanKind.CLIENT)
            try:
                answer = await self._try(ctx, attempt, deadline, ctx.spans.upstream(span, ctx.trace))
                if span.is_recording():
                    _describe(span, ctx, attempt, answer)
                if isinstance(answer, GatewayError):
                    last_refusal = answer
                    continue
                if answer is None:
                    continue
                resp, headers_at = answer
                self._answered(ctx, attempt, resp)
                await self._relay.relay(ctx, resp, headers_at, deadline, send)
                return
            finally:
                span.end()
                attempt.endpoint.in_flight -= 1
                backend_in_flight.dec()
        raise last_refusal or _nothing_answered(ctx.outcome.attempts)

    async def _try(
        self, ctx: RequestContext, attempt: Attempt, deadline: float, trace: TraceContext,
    ) -> tuple[UpstreamResponse, float] | GatewayError | None:
        """One endpoint: its response and when its headers came; the error to answer if no other endpoint does;
        or None when it could not be reached."""
        outcome = ctx.outcome
        outcome.attempts += 1
        if outcome.attempts > 1:
            self._metrics.retries.labels(attempt.route).inc()
        outcome.route, outcome.backend, outcome.endpoint = attempt.route, attempt.backend.name, attempt.endpoint.url
        outcome.adapter = attempt.backend.adapter
        ctx.parsed.payload["model"] = attempt.backend.served_model_name
        body = serialise(ctx.parsed.payload)
        if outcome.attempts == 1:
            outcome.overhead_s = time.perf_counter() - ctx.started
        sent_at = time.perf_counter()
        credential = self._credential.header
        resp = await self._send(ctx, attempt, body, credential, deadline, trace)
        if resp is not None and resp.status == 401 and (other := self._credential.after_refusal(credential)):
            resp.close()  # a rotation one side has seen and the other not yet: the same endpoint, the other one
            sent_at = time.perf_counter()
            resp = await self._send(ctx, attempt, body, other, deadline, trace)
        if resp is None:
            return None
        headers_at = time.perf_counter()
        outcome.upstream_s = headers_at - sent_at
        return await self._refusal(resp, attempt, deadline) or (resp, headers_at)

    async def _send(
        self, ctx: RequestContext, attempt: Attempt, body: bytes, credential: str | None, deadline: float,
        trace: TraceContext,
    ) -> UpstreamResponse | None:
        """The response once its headers are in; None if the endpoint could not be reached or answered garbage."""
        rank = ctx.principal.rank
        # Built here, never copied from the client: a client's own priority headers do not reach the runtime.
        headers = {
            "content-type": "application/json", "x-request-id": ctx.request_id.decode(errors="replace"),
            request_priority.PRIORITY_HEADER: str(rank.number),
            request_priority.TENANT_HEADER: request_priority.tenant_value(ctx.principal.tenant),
            request_priority.SHARE_HEADER: request_priority.share_value(rank.share),
            # What the tenant was charged for; the runtime refuses a prompt that turns out longer.
            prompt_reservation.HEADER: prompt_reservation.header_value(ctx.parsed.reserved_prompt_tokens),
        }
        # The client's trace, with this attempt as the parent span: a retry's attempts are siblings in one trace.
        headers.update(trace.headers())
        if credential is not None:
            headers[runtime_credential.HEADER] = credential
        left = ctx.budget_left()
        if left is not None:
            headers[request_deadline.BUDGET_HEADER] = request_deadline.header_value(left)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(min(loop.time() + self._timeouts.first_byte_s, deadline)):
                return await self.pool.request("POST", attempt.endpoint.url, ctx.upstream_path or ctx.path, body,
                                           headers)
        except UpstreamError as exc:
            self._failed(attempt, "connect" if exc.connect else "protocol")
            return None
        except TimeoutError:
            self._failed(attempt, "first_byte_timeout")
            raise GatewayError(504, "the model did not answer in time", code="upstream_timeout") from None

    async def _refusal(self, resp: UpstreamResponse, attempt: Attempt, deadline: float) -> GatewayError | None:
        """The error to answer if no other endpoint does, when this one refused the request (None: it answered)."""
        if resp.status == 401:
            # The runtime refused the gateway's credential (a wrong Secret, or a rotation the gateway has not
            # seen yet). The client's key is not at fault, so the client must not see the runtime's 401.
            resp.close()
            self._metrics.upstream_errors.labels(attempt.backend.name, "unauthorized").inc()
            return GatewayError(502, "the model server refused the gateway's runtime credential",
                                code="upstream_unauthorized")
        if resp.status not in _RETRY_STATUSES:
            return None
        try:
            async with asyncio.timeout_at(deadline):
                error_body = await resp.read(_MAX_ERROR_BODY)
        except (UpstreamError, TimeoutError):
            error_body = b""
        finally:
            resp.release()
        if resp.status == 503:
            self._metrics.upstream_errors.labels(attempt.backend.name, "overloaded").inc()
        else:
            self._failed(attempt, f"status_{resp.status}")
        retry_after = resp.headers.get("retry-after", "")
        code = upstream_code(error_body)
        return GatewayError(
            resp.status, upstream_message(error_body, resp.status),
            code=code if resp.status == 503 and code in _PASSED_ON_CODES else "upstream_error",
            headers=[(b"retry-after", retry_after.encode())] if retry_after else [],
        )

    def _answered(self, ctx: RequestContext, attempt: Attempt, resp: UpstreamResponse) -> None:
        self._picker.report_success(attempt.endpoint)
        self._metrics.upstream_latency.labels(attempt.route, attempt.backend.name).observe(ctx.outcome.upstream_s)
        # The adapter's name for its requests: what a client asked for, where the model's name says less.
        ctx.response_headers.append((b"x-sluice-backend", attempt.backend.public_name.encode()))
        # The routing table's version is stamped on the answer; without one, the engine's own says it (a Sluice
        # runtime's header and fingerprint), when it is one a header can hold.
        version = attempt.backend.version
        if version is not None and ctx.kind in _FINGERPRINTED:
            ctx.fingerprint = field(fingerprint(version))
        elif version is None and _VERSION.match(upstream := resp.headers.get(VERSION_HEADER, "")):
            version = upstream
        if version is not None:
            ctx.outcome.model_version = version
            ctx.response_headers.append((_VERSION_HEADER, version.encode()))

    def _failed(self, attempt: Attempt, kind: str) -> None:
        self._picker.report_failure(attempt.endpoint)
        self._metrics.upstream_errors.labels(attempt.backend.name, kind).inc()


def _describe(span, ctx: RequestContext, attempt: Attempt, answer) -> None:
    """An attempt's span: what the picker chose and why, and how the endpoint answered."""
    reason = ("fallback" if attempt.route != ctx.parsed.model else "retry" if ctx.outcome.attempts > 1
              else "first choice")
    span.set_attributes({"sluice.attempt": ctx.outcome.attempts, "sluice.route": attempt.route,
                         "sluice.backend": attempt.backend.name, "server.address": attempt.endpoint.url,
                         "sluice.pick.reason": reason})
    if answer is None:
        span.set_attribute("error.type", "unreachable")
    elif isinstance(answer, GatewayError):
        span.set_attributes({"error.type": answer.code or "upstream_error", "http.response.status_code": answer.status})
    else:
        span.set_attribute("http.response.status_code", answer[0].status)


def _nothing_answered(attempts: int) -> GatewayError:
    if attempts == 0:
        return GatewayError(503, "no endpoint can serve this model right now", code="no_ready_endpoint",
                            headers=[(b"retry-after", b"5")])
    return GatewayError(503, "no endpoint of this model could be reached; try again shortly",
                        code="upstream_unreachable", headers=[(b"retry-after", b"1")])

