"""Forwarding one request upstream: attempts before the first byte, then a pass-through response.

Retries happen only until an upstream has answered with headers; after that the response is the
client's, streamed event by event as it arrives. One `asyncio.timeout` carries the first-byte, idle and
total deadlines (rescheduled per chunk). Cancellation (the client left) closes the upstream connection
rather than returning it to the pool, so the runtime sees the disconnect and aborts the request.

Upstreams get the runtime credential, never the client's key. A non-streaming body is held whole (its
length goes in the headers), so it is capped; its usage is read from the small `usage` object alone.
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

from sluice_contracts import runtime_credential

from .config import Timeouts
from .errors import GatewayError
from .metrics import GatewayMetrics
from .picker import Attempt, Picker
from .upstream_client import ConnectionPool, ResponseTooLarge, UpstreamError, UpstreamResponse

Send = Callable[[dict[str, Any]], Awaitable[None]]

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_USAGE_WINDOW = 4096  # bytes from the start of the usage object that hold all of it
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]+)"')
_RETRY_STATUSES = {500, 502, 503, 504}
_MAX_PENDING = 1024 * 1024  # bytes of an unfinished event held back, at most
_MAX_ERROR_BODY = 64 * 1024  # of an upstream error, only the message is passed on


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
    def __init__(
        self, timeouts: Timeouts, picker: Picker, metrics: GatewayMetrics, *,
        credential: Callable[[], str | None], max_response_bytes: int,
    ) -> None:
        self._timeouts = timeouts
        self._picker = picker
        self._metrics = metrics
        self._credential = credential
        self._max_response_bytes = max_response_bytes
        self.pool = ConnectionPool(timeouts.connect_s)

    def close(self) -> None:
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
        loop = asyncio.get_running_loop()
        total_deadline = loop.time() + self._timeouts.total_s
        headers = {"content-type": "application/json", "x-request-id": request_id}
        credential = self._credential()
        if credential is not None:
            headers[runtime_credential.HEADER] = credential
        last_error: GatewayError | None = None
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
                refusal = await self._refusal(resp, attempt, total_deadline)
                if refusal is not None:
                    last_error = refusal
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
            raise last_error
        if outcome.attempts == 0:
            raise GatewayError(
                503, "no endpoint can serve this model right now", code="no_ready_endpoint",
                headers=[(b"retry-after", b"5")],
            )
        raise GatewayError(
            503, "no endpoint of this model could be reached; try again shortly", code="upstream_unreachable",
            headers=[(b"retry-after", b"1")],
        )

    async def _refusal(self, resp: UpstreamResponse, attempt: Attempt, deadline: float) -> GatewayError | None:
        """The error to answer if no other endpoint does, when this one refused the request (None: it answered)."""
        if resp.status == 401:
            # The runtime refused the gateway's credential (a rotation not yet seen by both sides, or a wrong
            # Secret). The client's key is not at fault, so the client must not see the runtime's 401.
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
        return GatewayError(
            resp.status, _upstream_message(error_body, resp.status), code="upstream_error",
            headers=[(b"retry-after", retry_after.encode())] if retry_after else [],
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
                data = await self._read_whole(resp, total_deadline, outcome)
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

    async def _read_whole(self, resp: UpstreamResponse, deadline: float, outcome: Outcome) -> bytes:
        try:
            async with asyncio.timeout_at(deadline):
                return await resp.read(self._max_response_bytes)
        except ResponseTooLarge:
            self._metrics.upstream_errors.labels(outcome.backend, "response_too_large").inc()
            raise GatewayError(
                502, f"the model's response is larger than the gateway's limit of {self._max_response_bytes} "
                "bytes; ask for fewer tokens, choices or logprobs, or stream it", code="upstream_response_too_large",
            ) from None
        except TimeoutError:
            raise GatewayError(504, "the model did not finish in time", code="upstream_timeout") from None
        except UpstreamError:
            raise GatewayError(502, "the model server closed the connection mid-response") from None


def _overhead_header(outcome: Outcome) -> tuple[bytes, bytes]:
    return (b"x-sluice-overhead-ms", f"{outcome.overhead_s * 1000:.3f}".encode())


def _read_usage(data: bytes, outcome: Outcome) -> None:
    """Usage and the first choice's finish reason, without parsing the body (it may be megabytes of logprobs).

    Inside JSON strings quotes are escaped, so an unescaped `"usage": {` is a key; OpenAI bodies have one,
    at the top level. Only the object after it is decoded.
    """
    finish = _FINISH.search(data)
    if finish:
        outcome.finish_reason = finish.group(1).decode()
    at = len(data)
    while (at := data.rfind(b'"usage"', 0, at)) >= 0:
        key = _USAGE.match(data, at)
        if key is None:
            continue
        window = data[key.end() - 1 : key.end() - 1 + _USAGE_WINDOW].decode("utf-8", errors="replace")
        try:
            usage, _ = json.JSONDecoder().raw_decode(window)
        except ValueError:
            return
        _take_usage(usage, outcome)
        return


def _take_usage(usage: Any, outcome: Outcome) -> None:
    """Counts only when both are plain non-negative integers: anything else leaves the reservation as it was."""
    if not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    if _is_count(prompt) and _is_count(completion):
        outcome.prompt_tokens, outcome.completion_tokens = prompt, completion


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 53


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
                parsed = json.loads(event[5:])
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                _take_usage(parsed.get("usage"), outcome)
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
