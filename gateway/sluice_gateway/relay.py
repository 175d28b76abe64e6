"""Sending an upstream's answer to the client: whole (a non-streaming body, held and capped) or as a stream
(event by event as it arrives, under the idle and total deadlines).

Once the response headers are out the status cannot change: a stream cut short by the upstream ends with an
error event in the stream's own format, and so does an error answer to a stream whose headers went out while it
was held for its model to start (cold_start_hold.py). A response not read to its end closes its upstream connection (never
reused), so the runtime sees the disconnect and aborts the request.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .config import Timeouts
from .connection_pool import ResponseTooLarge, UpstreamError, UpstreamResponse
from .errors import GatewayError, error_type
from .metrics import GatewayMetrics
from .request_context import RequestContext
from .usage_scan import inspect_events, read_usage
from .version_stamp import stamp_body, stamp_events

Send = Callable[[dict[str, Any]], Awaitable[None]]

_MAX_PENDING = 1024 * 1024  # bytes of an unfinished event held back, at most
# Of an answer passed through unheld, the start and the end are kept: its usage object is in one of them.
_USAGE_EDGE = 64 * 1024


class HeldBytes:
    """The bytes of whole answers held at once, across requests, within `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class ResponseRelay:
    def __init__(self, timeouts: Timeouts, metrics: GatewayMetrics, max_response_bytes: int,
                 max_held_response_bytes: int) -> None:
        self._timeouts = timeouts
        self._metrics = metrics
        self._max_response_bytes = max_response_bytes
        self._held = HeldBytes(max_held_response_bytes)

    async def relay(
        self, ctx: RequestContext, resp: UpstreamResponse, headers_at: float, deadline: float, send: Send,
    ) -> None:
        """Pass `resp` (its headers arrived at `headers_at`) to the client by the loop-time `deadline`."""
        ctx.outcome.status = resp.status
        try:
            if ctx.stream and resp.content_type == "text/event-stream":
                await self._stream(ctx, resp, headers_at, deadline, send)
            elif ctx.response_started:
                await self._as_error_event(ctx, resp, deadline, send)
            else:
                await self._whole(ctx, resp, deadline, send)
        except (UpstreamError, TimeoutError) as exc:
            await self._cut_short(ctx, exc, send)
        finally:
            resp.release()  # back to the pool if read to its end, else closed

    async def _whole(self, ctx: RequestContext, resp: UpstreamResponse, deadline: float, send: Send) -> None:
        """Held whole (so that a failure can still be told with a status), within the per-answer bound and,
        together with every other answer held now, `max_held_response_bytes`; past that, passed through."""
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_response_bytes:
            raise self._too_large(ctx)
        chunks: list[bytes] = []
        size = 0
        try:
            async with self._reading(ctx, deadline):
                async for chunk in resp.iter_chunks():
                    if size + len(chunk) > self._max_response_bytes:
                        raise ResponseTooLarge("too large")
                    if not self._held.take(len(chunk)):
                        self._metrics.responses_passed_through.inc()
                        await self._pass_through(ctx, resp, [*chunks, chunk], deadline, send)
                        return
                    chunks.append(chunk)
                    size += len(chunk)
            data = b"".join(chunks)
            chunks.clear()
            if ctx.fingerprint is not None and resp.status == 200:
                data = stamp_body(data, ctx.fingerprint)
            await send({"type": "http.response.start", "status": resp.status, "headers": [
                *_content_headers(resp), (b"content-length", str(len(data)).encode()), *ctx.response_headers,
                _overhead_header(ctx),
            ]})
            ctx.outcome.responded = True
            await send({"type": "http.response.body", "body": data})
        finally:
            self._held.give(size)
        if resp.status == 200:  # after sending: accounting is off the client's critical path
            read_usage(data, ctx.outcome)

    async def _pass_through(
        self, ctx: RequestContext, resp: UpstreamResponse, first: list[bytes], deadline: float, send: Send,
    ) -> None:
        """The answer as it arrives (its length unsaid: chunked), holding none of it. Its headers are out, so a
        failure from here on cuts it short instead of answering 502."""
        await send({"type": "http.response.start", "status": resp.status, "headers": [
            *_content_headers(resp), *ctx.response_headers, _overhead_header(ctx),
        ]})
        head = b"".join(first)
        if ctx.fingerprint is not None and resp.status == 200:
            head = stamp_body(head, ctx.fingerprint)
        await send({"type": "http.response.body", "body": head, "more_body": True})
        head, tail = head[:_USAGE_EDGE], head[-_USAGE_EDGE:]
        try:
            async with asyncio.timeout_at(deadline):
                async for chunk in resp.iter_chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    tail = (tail + chunk)[-_USAGE_EDGE:]
        except (UpstreamError, TimeoutError):
            # Left unfinished: the server closes the connection, and the client sees an incomplete answer.
            self._metrics.upstream_errors.labels(ctx.outcome.backend, "mid_response").inc()
            ctx.outcome.status, ctx.outcome.finish_reason = 502, "upstream_error"
            return
        ctx.outcome.responded = True
        await send({"type": "http.response.body", "body": b""})
        if resp.status == 200:
            read_usage(head + b" " + tail, ctx.outcome)

    async def _as_error_event(self, ctx: RequestContext, resp: UpstreamResponse, deadline: float, send: Send) -> None:
        """An answer that is not a stream, to a stream whose headers are out: its error as the last event."""
        data = await self._read_whole(ctx, resp, deadline)
        ctx.outcome.responded = True
        await send({"type": "http.response.body", "body": error_event(resp.status, upstream_message(data, resp.status))})

    async def _stream(
        self, ctx: RequestContext, resp: UpstreamResponse, headers_at: float, deadline: float, send: Send,
    ) -> None:
        loop = asyncio.get_running_loop()
        ctx.outcome.overhead_s += time.perf_counter() - headers_at
        if not ctx.response_started:
            await send({"type": "http.response.start", "status": resp.status, "headers": [
                *_content_headers(resp), (b"cache-control", b"no-cache"), *ctx.response_headers, _overhead_header(ctx),
            ]})
        pending = b""
        idle = self._timeouts.idle_s
        async with asyncio.timeout_at(min(loop.time() + idle, deadline)) as silence:
            async for chunk in resp.iter_chunks():
                silence.reschedule(min(loop.time() + idle, deadline))
                pending += chunk
                if resp.finished:
                    break  # the rest goes out with the end of the response, in one write
                cut = pending.rfind(b"\n\n")
                if cut < 0:
                    if len(pending) > _MAX_PENDING:  # not SSE as we know it: pass it on rather than hoard it
                        await send({"type": "http.response.body", "body": pending, "more_body": True})
                        pending = b""
                    continue
                events, pending = pending[: cut + 2], pending[cut + 2 :]
                if events := self._events(ctx, events):
                    await send({"type": "http.response.body", "body": events, "more_body": True})
        ctx.outcome.responded = True
        await send({"type": "http.response.body", "body": self._events(ctx, pending)})

    async def _cut_short(self, ctx: RequestContext, exc: Exception, send: Send) -> None:
        """Headers are out: say what happened in the stream's own format."""
        reason = "timed out" if isinstance(exc, TimeoutError) else "closed the connection"
        self._metrics.upstream_errors.labels(ctx.outcome.backend, "mid_stream").inc()
        ctx.outcome.finish_reason = "upstream_error"
        ctx.outcome.responded = True
        await send({"type": "http.response.body", "body": error_event(502, f"the model server {reason} mid-response")})

    def _events(self, ctx: RequestContext, events: bytes) -> bytes:
        outcome = ctx.outcome
        if events and outcome.ttft_s is None:
            outcome.ttft_s = time.perf_counter() - ctx.started
            self._metrics.ttft.labels(outcome.route, outcome.backend).observe(outcome.ttft_s)
        events = inspect_events(events, ctx.strip_usage, outcome)
        return events if ctx.fingerprint is None else stamp_events(events, ctx.fingerprint)

    def _too_large(self, ctx: RequestContext) -> GatewayError:
        self._metrics.upstream_errors.labels(ctx.outcome.backend, "response_too_large").inc()
        return GatewayError(
            502, f"the model's response is larger than the gateway's limit of {self._max_response_bytes} "
            "bytes; ask for fewer tokens, choices or logprobs, or stream it", code="upstream_response_too_large",
        )

    async def _read_whole(self, ctx: RequestContext, resp: UpstreamResponse, deadline: float) -> bytes:
        async with self._reading(ctx, deadline):
            return await resp.read(self._max_response_bytes)

    @contextlib.asynccontextmanager
    async def _reading(self, ctx: RequestContext, deadline: float) -> AsyncIterator[None]:
        """An upstream answer read until `deadline`, its failures turned into the client's errors."""
        try:
            async with asyncio.timeout_at(deadline):
                yield
        except ResponseTooLarge:
            raise self._too_large(ctx) from None
        except TimeoutError:
            raise GatewayError(504, "the model did not finish in time", code="upstream_timeout") from None
        except UpstreamError:
            raise GatewayError(502, "the model server closed the connection mid-response") from None


def error_event(status: int, message: str, code: str | None = None) -> bytes:
    """An error as the last event of a stream whose headers are out, in the shape the OpenAI client raises."""
    error = json.dumps({"error": {"message": message, "type": error_type(status), "param": None, "code": code}})
    return f"data: {error}\n\n".encode()


def upstream_message(body: bytes, status: int) -> str:
    try:
        message = json.loads(body)["error"]["message"]
        if isinstance(message, str):
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return f"the model server answered {status}"


def upstream_code(body: bytes) -> str | None:
    """The code of an upstream's OpenAI error body, if it has one."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


def _content_headers(resp: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", resp.headers.get("content-type", "application/json").encode())]


def _overhead_header(ctx: RequestContext) -> tuple[bytes, bytes]:
    return (b"x-sluice-overhead-ms", f"{ctx.outcome.overhead_s * 1000:.3f}".encode())
