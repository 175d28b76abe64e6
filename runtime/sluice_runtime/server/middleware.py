"""The outermost layer of every request: request id, trace context, body size limit, drain gate, last-resort
errors, log line, and with tracing on the request's spans (request_spans.py), once it has ended.

Written as plain ASGI rather than Starlette's BaseHTTPMiddleware so that streamed responses pass
straight through and a client disconnect still reaches the handler.
"""
from __future__ import annotations

import logging
import time
import uuid

from sluice_contracts import model_version as served_version
from sluice_contracts import request_id, trace_context
from sluice_contracts.runtime_credential import OPEN_PATHS

from .disconnect import ClientDisconnected, ClientStalled
from .errors import APIError, internal_error, shutting_down, unauthorized
from .request_log import RequestRecord
from .request_spans import ResponseTimes, emit

log = logging.getLogger("sluice.server")


_TRACEPARENT, _TRACESTATE = trace_context.TRACEPARENT.encode(), trace_context.TRACESTATE.encode()
_TRACE_ID = trace_context.TRACE_ID_HEADER.encode()
_VERSION = served_version.HEADER.encode()


class _BodyTooLarge(Exception):
    pass


class RequestContextMiddleware:
    def __init__(self, app, *, max_body_bytes: int, lifecycle, metrics, credential=None, model_version: str,
                 tracing=None):
        self.app = app
        self._tracing = tracing
        self._version = (_VERSION, model_version.encode())
        self._credential = credential
        self._max_body = max_body_bytes
        self._lifecycle = lifecycle
        self._metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        record = _new_record(scope, headers)
        state = scope.setdefault("state", {})
        state["request_id"] = record.request_id
        state["record"] = record
        started = time.monotonic()
        response = arrived_ns = None
        if self._tracing is not None and record.path not in OPEN_PATHS:
            response, arrived_ns = ResponseTimes(), time.time_ns()
            send = _timing(send, response)
        try:
            await self._serve(scope, receive, _sending_request_id(send, record, self._version), headers, record)
        finally:
            if record.path not in OPEN_PATHS:
                record.total_s = round(time.monotonic() - started, 4)
                if record.cancelled:
                    record.status = 499
                self._metrics.observe_http(_endpoint(record.path), record.status or 0)
                record.emit()
                if response is not None:
                    emit(self._tracing, record, _caller_trace(scope), arrived_ns, time.time_ns(), response)

    async def _serve(self, scope, receive, send, headers: dict[str, str], record: RequestRecord) -> None:
        """The route's answer, or the refusal or error that takes its place; record.status is set once a
        response has started, after which nothing else can be sent."""
        refusal = self._refusal(scope, headers)
        try:
            if refusal is not None:
                await self._send_error(refusal, record, scope, receive, send)
            else:
                await self.app(scope, _limited(receive, self._max_body), send)
        except ClientStalled:
            # The stream's events were closed, which aborted the engine request; uvicorn drops the connection.
            record.cancelled = True
            record.error_code = "client_stalled"
            self._metrics.observe_stalled()
        except ClientDisconnected:
            # Nobody is left to answer; the handler already aborted the engine request.
            record.cancelled = True
        except _BodyTooLarge:
            if record.status is None:
                await self._send_error(self._too_large(), record, scope, receive, send)
        except Exception:
            log.exception("unhandled error in request %s", record.request_id)
            if record.status is None:
                await self._send_error(internal_error(record.request_id), record, scope, receive, send)

    def _refusal(self, scope, headers: dict[str, str]) -> APIError | None:
        """What a request is answered with before it reaches a route, if anything."""
        path = scope["path"]
        missing_credential = self._credential.refusal(path, scope["headers"]) if self._credential else None
        if missing_credential is not None:
            return unauthorized(missing_credential)
        # Probes and scrapes (the paths open without the credential) keep answering while draining, and are not
        # worth a log line each.
        if self._lifecycle.draining and path not in OPEN_PATHS:
            return shutting_down()
        if _int(headers.get("content-length")) > self._max_body:
            return self._too_large()
        return None

    def _too_large(self) -> APIError:
        return APIError(413, f"The request body is larger than the server's limit of {self._max_body} bytes.",
                        code="request_too_large")

    @staticmethod
    async def _send_error(err: APIError, record: RequestRecord, scope, receive, send) -> None:
        record.error_code = err.code
        await err.response()(scope, receive, send)


def _sending_request_id(send, record: RequestRecord, version: tuple[bytes, bytes]):
    """`send` that records the status and adds x-request-id (the client's own when it sent a usable one), the
    request's trace id and the served model version."""
    ids = [(b"x-request-id", (record.client_request_id or record.request_id).encode()),
           (_TRACE_ID, record.trace_id.encode()), version]

    async def send_with_id(message):
        if message["type"] == "http.response.start":
            record.status = message["status"]
            message = dict(message)
            message["headers"] = list(message.get("headers", [])) + ids
        await send(message)

    return send_with_id


def _timing(send, times: ResponseTimes):
    """`send` that notes when the response's headers and each body chunk went to the client (with tracing on)."""
    async def timed_send(message):
        await send(message)
        if message["type"] == "http.response.start":
            times.started_ns = time.time_ns()
        elif message["type"] == "http.response.body":
            times.last_ns = time.time_ns()
            times.chunks += 1

    return timed_send


def _limited(receive, max_body: int):
    """`receive` that stops a body growing past `max_body`, whatever its content-length said."""
    received = 0

    async def counting_receive():
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_body:
                raise _BodyTooLarge()
        return message

    return counting_receive


def _new_record(scope, headers: dict[str, str]) -> RequestRecord:
    """The request's log record, named by a new unique id. The client's x-request-id is kept beside it (and
    echoed), never used inside: two requests sending one id must not meet in the engine, where an id names
    the request to stream to and to abort."""
    client_id = headers.get("x-request-id", "")
    # The caller's trace (the gateway's attempt is its parent span), else one of its own: every line names one.
    trace = _caller_trace(scope)
    return RequestRecord(request_id=f"req-{uuid.uuid4().hex}", method=scope["method"], path=scope["path"],
                         client_request_id=client_id if request_id.TEXT.match(client_id) else None,
                         trace_id=(trace or trace_context.new_trace()).trace_id,
                         parent_span_id=trace.parent_id if trace else None)


def _caller_trace(scope) -> trace_context.TraceContext | None:
    raw = scope.get("headers", [])
    return trace_context.read([v.decode("latin-1") for k, v in raw if k == _TRACEPARENT],
                              [v.decode("latin-1") for k, v in raw if k == _TRACESTATE])


def _int(value: str | None) -> int:
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _endpoint(path: str) -> str:
    """A bounded label value: known API paths as they are, anything else as 'other'."""
    known = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/v1/models", "/tokenize",
             "/detokenize")
    for prefix in known:
        if path == prefix or path.startswith(prefix + "/"):
            return prefix
    return "other"
