"""Forwarding one request upstream: attempts before the first byte, then a pass-through response.

Retries happen only until an upstream has answered with headers; after that the response is the
client's, streamed event by event as it arrives. One `asyncio.timeout` carries the first-byte, idle and
total deadlines (rescheduled per chunk). Cancellation (the client left) closes the upstream connection
rather than returning it to the pool, so the runtime sees the disconnect and aborts the request.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from .config import Timeouts
from .errors import GatewayError
from .metrics import GatewayMetrics
from .picker import Attempt, Picker
from .upstream_client import ConnectionPool, UpstreamError, UpstreamResponse

Send = Callable[[dict[str, Any]], Awaitable[None]]

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]+)"')
_RETRY_STATUSES = {500, 502, 503, 504}
_MAX_PENDING = 1024 * 1024  # bytes of an unfinished event held back, at most


@dataclass(slots=True)
class Outcome:
    """What happened to one request; feeds the metrics and the access log."""

    route: str = ""
    backend: str = ""
    endpoint: str = ""
    status: int = 0
    attempts: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    overhead_s: float = 0.0
    upstream_s: float | None = None
    ttft_s: float | None = None
    responded: bool = False  # the final body chunk was handed to the server


class Upstream:
    def __init__(self, timeouts: Timeouts, picker: Picker, metrics: GatewayMetrics) -> None:
        self._timeouts = timeouts
        self._picker = picker
        self._metrics = metrics
        self.pool: ConnectionPool | None = None

    async def start(self) -> None:
        self.pool = ConnectionPool(self._timeouts.connect_s)

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    async def forward(
        self,
        attempts: Iterator[Attempt],
        max_attempts: int,
        path: str,
        payload: dict[str, Any],
        *,
        stream: bool,
        strip_usage: bool,
        request_id: str,
        started: float,
        response_headers: list[tuple[bytes, bytes]],
        send: Send,
        outcome: Outcome,
    ) -> None:
        assert self.pool is not None
        loop = asyncio.get_running_loop()
        total_deadline = loop.time() + self._timeouts.total_s
        headers = {"content-type": "application/json", "x-request-id": request_id}
        last_error: tuple[int, bytes, str] | None = None
        for attempt in islice(attempts, max_attempts):
            outcome.attempts += 1
            if outcome.attempts > 1:
                self._metrics.retries.labels(attempt.route).inc()
            endpoint = attempt.endpoint
            outcome.route, outcome.backend, outcome.endpoint = attempt.route, attempt.backend.name, endpoint.url
            payload["model"] = attempt.backend.served_model_name
            body = json.dumps(payload, separators=(",", ":")).encode()
            endpoint.in_flight += 1
            try:
                sent_at = time.perf_counter()
                if outcome.attempts == 1:
                    outcome.overhead_s = sent_at - started
                try:
                    async with asyncio.timeout_at(min(loop.time() + self._timeouts.first_byte_s, total_deadline)):
                        resp = await self.pool.request("POST", endpoint.url, path, body, headers)
                except UpstreamError as exc:
                    self._failed(attempt, "connect" if exc.connect else "protocol")
                    continue
                except TimeoutError:
                    # Not retried: the wait already used the client's patience, and another endpoint would
                    # start the whole generation again.
                    self._failed(attempt, "first_byte_timeout")
                    raise GatewayError(504, "the model did not answer in time", code="upstream_timeout") from None
                headers_at = time.perf_counter()
                outcome.upstream_s = headers_at - sent_at
                if resp.status in _RETRY_STATUSES:
                    try:
                        async with asyncio.timeout_at(total_deadline):
                            error_body = await resp.read()
                    except (UpstreamError, TimeoutError):
                        error_body = b""
                    finally:
                        resp.release()
                    last_error = (resp.status, error_body, resp.headers.get("retry-after", ""))
                    if resp.status == 503:
                        self._metrics.upstream_errors.labels(attempt.backend.name, "overloaded").inc()
                    else:
                        self._failed(attempt, f"status_{resp.status}")
                    continue
                self._picker.report_success(endpoint)
                self._metrics.upstream_latency.labels(attempt.route, attempt.backend.name).observe(outcome.upstream_s)
                response_headers.append((b"x-sluice-backend", attempt.backend.name.encode()))
                await self._respond(
                    resp, stream and resp.content_type == "text/event-stream", strip_usage, total_deadline,
                    started, headers_at, response_headers, send, outcome,
                )
                return
            finally:
                endpoint.in_flight -= 1
        if last_error is not None:
            status, body, retry_after = last_error
            extra = [(b"retry-after", retry_after.encode())] if retry_after else []
            raise GatewayError(status, _upstream_message(body, status), headers=extra, code="upstream_error")
        if outcome.attempts == 0:
            raise GatewayError(
                503, "no endpoint can serve this model right now", code="no_ready_endpoint",
                headers=[(b"retry-after", b"5")],
            )
        raise GatewayError(
            503, "no endpoint of this model could be reached; try again shortly", code="upstream_unreachable",
            headers=[(b"retry-after", b"1")],
        )

    def _events(self, events: bytes, strip_usage: bool, started: float, outcome: Outcome) -> bytes:
        if events and outcome.ttft_s is None:
            outcome.ttft_s = time.perf_counter() - started
            self._metrics.ttft.labels(outcome.route, outcome.backend).observe(outcome.ttft_s)
        return _inspect_events(events, strip_usage, outcome)

    def _failed(self, attempt: Attempt, kind: str) -> None:
        self._picker.report_failure(attempt.endpoint)
        self._metrics.upstream_errors.labels(attempt.backend.name, kind).inc()

    async def _respond(
        self,
        resp: UpstreamResponse,
        stream: bool,
        strip_usage: bool,
        total_deadline: float,
        started: float,
        headers_at: float,
        response_headers: list[tuple[bytes, bytes]],
        send: Send,
        outcome: Outcome,
    ) -> None:
        loop = asyncio.get_running_loop()
        outcome.status = resp.status
        complete = False
        try:
            content_type = resp.headers.get("content-type", "application/json").encode()
            if not stream:
                try:
                    async with asyncio.timeout_at(total_deadline):
                        data = await resp.read()
                except (UpstreamError, TimeoutError) as exc:
                    if isinstance(exc, TimeoutError):
                        raise GatewayError(504, "the model did not finish in time", code="upstream_timeout") from None
                    raise GatewayError(502, "the model server closed the connection mid-response") from None
                body_at = time.perf_counter()
                complete = True
                outcome.overhead_s += time.perf_counter() - body_at
                await send({"type": "http.response.start", "status": resp.status, "headers": [
                    (b"content-type", content_type), (b"content-length", str(len(data)).encode()),
                    *response_headers, _overhead_header(outcome),
                ]})
                outcome.responded = True
                await send({"type": "http.response.body", "body": data})
                if resp.status == 200:  # after sending: accounting is off the client's critical path
                    _read_usage(data, outcome)
                return
            outcome.overhead_s += time.perf_counter() - headers_at
            await send({"type": "http.response.start", "status": resp.status, "headers": [
                (b"content-type", content_type), (b"cache-control", b"no-cache"),
                *response_headers, _overhead_header(outcome),
            ]})
            pending = b""
            idle = self._timeouts.idle_s
            async with asyncio.timeout_at(min(loop.time() + idle, total_deadline)) as deadline:
                async for chunk in resp.iter_chunks():
                    deadline.reschedule(min(loop.time() + idle, total_deadline))
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
                    events = self._events(events, strip_usage, started, outcome)
                    if events:
                        await send({"type": "http.response.body", "body": events, "more_body": True})
            complete = True
            outcome.responded = True
            await send({"type": "http.response.body", "body": self._events(pending, strip_usage, started, outcome)})
        except (UpstreamError, TimeoutError) as exc:
            # Headers are out: the status cannot change, so say what happened in the stream's own format.
            reason = "timed out" if isinstance(exc, TimeoutError) else "closed the connection"
            self._metrics.upstream_errors.labels(outcome.backend, "mid_stream").inc()
            outcome.finish_reason = "upstream_error"
            error = json.dumps({"error": {"message": f"the model server {reason} mid-response",
                                          "type": "upstream_error", "param": None, "code": None}})
            outcome.responded = True
            await send({"type": "http.response.body", "body": f"data: {error}\n\n".encode()})
        finally:
            if complete:
                resp.release()
            else:
                resp.close()


def _overhead_header(outcome: Outcome) -> tuple[bytes, bytes]:
    return (b"x-sluice-overhead-ms", f"{outcome.overhead_s * 1000:.3f}".encode())


def _read_usage(data: bytes, outcome: Outcome) -> None:
    if not _USAGE.search(data):
        return
    try:
        parsed = json.loads(data)
    except ValueError:
        return
    _take_usage(parsed, outcome)
    choices = parsed.get("choices") if isinstance(parsed, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        outcome.finish_reason = choices[0].get("finish_reason")


def _take_usage(parsed: Any, outcome: Outcome) -> None:
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    if isinstance(usage, dict):
        outcome.prompt_tokens = usage.get("prompt_tokens")
        outcome.completion_tokens = usage.get("completion_tokens", 0)


def _inspect_events(events: bytes, strip_usage: bool, outcome: Outcome) -> bytes:
    """Note finish reason and usage; drop the usage-only event the gateway asked for on the client's behalf."""
    finish = _FINISH.search(events)
    if finish:
        outcome.finish_reason = finish.group(1).decode()
    if not _USAGE.search(events):
        return events
    kept = []
    for event in events.split(b"\n\n"):
        if event and _USAGE.search(event) and event.startswith(b"data:"):
            try:
                _take_usage(json.loads(event[5:]), outcome)
            except ValueError:
                pass
            if strip_usage and _EMPTY_CHOICES.search(event):
                continue
        kept.append(event)
    return b"\n\n".join(kept)


def _upstream_message(body: bytes, status: int) -> str:
    try:
        message = json.loads(body)["error"]["message"]
        if isinstance(message, str):
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return f"the model server answered {status}"
