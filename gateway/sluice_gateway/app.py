"""The gateway's HTTP front: a plain ASGI app (no framework on the hot path, for latency).

Request path: auth → body → parse → model permission → route lookup → context check → limits → held while the
model has no endpoint (cold_start_hold.py) → a less urgent priority class waits while every replica is saturated
(priority_hold.py) → pick and forward (forwarder.py) → relay the response (relay.py).
OpenAI's Responses and Anthropic's Messages take the chat path, translated on the way in and out (adapted_api.py).
The lines of OpenAI batches (batch/) take the same path from the batch executor, as their tenant at the batch
priority class, outside its online limits; each has its own request id, and its batch's id as its client's.
The request travels as one RequestContext, with its budget (budget.py: its client's timeout), which bounds both
holds and the retries and goes upstream as what is left of it.
With OTEL_* tracing configured (tracing_setup.py), each proxied request is a trace of spans, one per step
(request_spans.py).
Every response carries `x-request-id` and `x-sluice-overhead-ms`; every proxied request writes one JSON
access-log line (access_record.py; with the key's id, never the key), one audit record (audit/) and adds what it
used to the usage counters (usage/), which admin keys read at `GET /v1/usage`.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from sluice_contracts import request_id, trace_context
from sluice_contracts.routing_table import Route, RoutingTable
from sluice_contracts.tracing_environment import TracingSettingsError

from .access_record import UNKNOWN_ROUTE, record
from .adapted_api import AdaptedSend, Stopped
from .admission import Admission
from .audit.admin_events import event, key_events, table_event
from .audit.answer_watch import AnswerWatch
from .audit.prompt_capture import Capture
from .audit.request_record import own_record, request_record
from .audit.sink import AuditSink
from .auth import KeyStore, require_principal
from .batch.api import ENDPOINTS as BATCH_ENDPOINTS
from .batch.api import BatchApi
from .batch.executor import BatchExecutor
from .budget import client_budget
from .client_io import ClientGone, DeadlinedSend, read_body, send_all
from .cold_start_hold import ColdStartHold
from .config import START_ONLY_FIELDS, GatewayConfig, PromptCapture
from .cost import check_context, reserve
from .errors import GatewayError
from .files.gateway_files import WatchedFiles
from .forwarder import Forwarder, Send
from .limits import Limiter
from .limits.memory import MemoryLimiter
from .limits.redis import RedisLimiter
from .load_poller import LoadPoller
from .messages_api import MessagesAdapter
from .metrics import GatewayMetrics
from .picker import Picker
from .plain_endpoints import GET_ROUTES, model, require_admin
from .priority_hold import PriorityHold
from .relay import error_event
from .request import parse_request_off_loop, stop_parser, warm_parser
from .request_context import RequestContext
from .request_spans import OPERATIONS, RequestSpans
from .response_store import ResponseStore
from .responses_api import ResponsesAdapter, cancel, delete, stored
from .routing_table import max_model_len, permitted_routes, starting_models
from .tracing_setup import tracing_from_environment
from .usage.counts import Cell, hour_of, request_counts
from .usage.memory_store import MemoryUsage
from .usage.query import parse_query
from .usage.redis_store import RedisUsage
from .usage.report import usage_answer
from .usage.store import UsageStore

log = logging.getLogger("sluice_gateway")

_PROXIED = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
    "/v1/rerank": "rerank",
}
# Other APIs' formats, served as chat (adapted_api.py).
_ADAPTED = {"/v1/responses": "responses", "/v1/messages": "messages"}
_CHAT_PATH = next(path for path, kind in _PROXIED.items() if kind == "chat")
_RESPONSES = "/v1/responses/"
_BATCH_ROOTS = ("/v1/files", "/v1/batches")
_BATCH_PREFIXES = tuple(root + "/" for root in _BATCH_ROOTS)
# What a multipart upload adds around the file itself, allowed past batch.max_file_bytes.
_FORM_FRAMING_BYTES = 64 * 1024
_MODELS = "/v1/models/"
_USAGE = "/v1/usage"
_JSON = (b"content-type", b"application/json")
_TRACEPARENT, _TRACESTATE = trace_context.TRACEPARENT.encode(), trace_context.TRACESTATE.encode()
_TRACE_ID = trace_context.TRACE_ID_HEADER.encode()
# Probes get no audit record: they are no one's request, and a kubelet's would flood the trail.
_PROBES = frozenset({"/health", "/ready"})
# Every API endpoint served, for the compatibility table of the README (checked against it by a test).
API_ROUTES = (*(("POST", path) for path in (*_PROXIED, *_ADAPTED)), ("GET", "/v1/models"),
              ("GET", _MODELS + "{model}"), ("GET", _RESPONSES + "{id}"),
              ("DELETE", _RESPONSES + "{id}"), ("POST", _RESPONSES + "{id}/cancel"),
              ("POST", "/v1/files"), ("GET", "/v1/files"), ("GET", "/v1/files/{id}"),
              ("GET", "/v1/files/{id}/content"), ("DELETE", "/v1/files/{id}"), ("POST", "/v1/batches"),
              ("GET", "/v1/batches"), ("GET", "/v1/batches/{id}"), ("POST", "/v1/batches/{id}/cancel"),
              ("GET", _USAGE))
# Request ids: a random per-process prefix and a counter, unique without a system call per request.
_request_ids = (f"{uuid.uuid4().hex[:16]}{n:08x}".encode() for n in itertools.count())


class GatewayApp:
    """Serves from `config_path` (and the routing table and credential it names), kept in force while it runs.

    Until a usable config has been read the gateway has no keys: it answers /health, fails /ready, refuses
    every API call with 401 and keeps watching the file.
    """

    def __init__(self, config_path: Path, routes_path: Path | None = None) -> None:
        self.metrics = GatewayMetrics()
        try:
            self.tracing = tracing_from_environment()
        except TracingSettingsError as exc:
            raise SystemExit(f"sluice-gateway: {exc}") from None  # a start-up setting: the message, no traceback
        self.metrics.ready.set_function(lambda: 1 if self.not_ready_reason() is None else 0)
        self.table = RoutingTable()
        self._started = False
        self._terminating = False
        self._tasks: list[asyncio.Task] = []
        self._poller: asyncio.Task | None = None
        # Streamed responses running on this replica, by (tenant, id): what POST /v1/responses/{id}/cancel stops.
        self.running_responses: dict[tuple[str, str], ResponsesAdapter] = {}
        self.audit = AuditSink("off", self.metrics.audit_write_failures.inc)
        self.capture = Capture(PromptCapture(), self.metrics.prompt_capture_write_failures.inc, lambda: self.config)
        self._usage_task: asyncio.Task | None = None
        self._rejected: dict[str, str | None] = {}  # the problem of each followed file, as last written to the trail
        self.files = WatchedFiles(config_path, routes_path, self.metrics, self.apply_config, self.apply_table)
        self._configure(GatewayConfig())  # no tenants, no keys: in force only until the file is read
        self._configured = False
        self.files.check()

    def _configure(self, config: GatewayConfig) -> None:
        self.config = config
        self.keys = KeyStore(config)
        self.picker = Picker(config.routing)
        self.picker.sync(self.table)
        self.priority_hold = PriorityHold(self.picker, self.metrics)
        self.forwarder = Forwarder(
            config.timeouts, self.picker, self.metrics, credential=self.files.upstream_credential,
            max_response_bytes=config.max_response_bytes, max_held_response_bytes=config.max_held_response_bytes,
        )
        self.hold = ColdStartHold(config.cold_start, self.metrics)
        self.limiter: Limiter = (
            RedisLimiter(config.redis, lease_ttl_s=config.cold_start.max_wait_s + config.timeouts.total_s + 60)
            if config.redis is not None else MemoryLimiter()
        )
        self.responses = ResponseStore(config.responses.store_ttl_s,
                                       self.limiter.client if isinstance(self.limiter, RedisLimiter) else None)
        self.batch_api = BatchApi(config.batch, lambda: (self.table, self.config.default_max_tokens), self.metrics)
        self.audit.close()
        self.audit = AuditSink(config.audit.sink, self.metrics.audit_write_failures.inc)
        self.capture.close()
        self.capture = Capture(config.audit.prompt_capture, self.metrics.prompt_capture_write_failures.inc, lambda: self.config)
        self.usage: UsageStore = (RedisUsage(self.limiter.client) if isinstance(self.limiter, RedisLimiter)
                                  else MemoryUsage())
        if self._started:
            self._start_polling()
            self._start_usage()

    def apply_config(self, config: GatewayConfig) -> None:
        if not self._configured:
            # The stand-in served no request (it has no keys), so all of it can be replaced.
            self.forwarder.close()
            self._configure(config)
            self._configured = True
            log.info("gateway config loaded: %d tenants, %d admin keys", len(config.tenants), len(config.admin_keys))
            self.audit.write(event("config_loaded", tenants=len(config.tenants),
                                   keys=sum(len(t.keys) for t in config.tenants), admin_keys=len(config.admin_keys)))
            _warn_of_tenants_without_models(config)
            return
        kept = [name for name in START_ONLY_FIELDS if getattr(config, name) != getattr(self.config, name)]
        if kept:
            log.warning("gateway config: changes to %s take effect at the next restart", ", ".join(kept))
            config = config.model_copy(update={name: getattr(self.config, name) for name in kept})
        for change in key_events(self.config, config):
            self.audit.write(change)
        self.config = config
        self.keys = KeyStore(config)
        log.info("gateway config reloaded: %d tenants, %d admin keys", len(config.tenants), len(config.admin_keys))
        _warn_of_tenants_without_models(config)

    def apply_table(self, table: RoutingTable) -> None:
        if (change := table_event(self.table, table)) is not None:
            self.audit.write(change)
        self.picker.sync(table)
        self.table = table
        self.metrics.table_generation.set(table.generation)
        self.hold.table_changed()

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def startup(self) -> None:
        self._started = True
        warm_parser()
        self._start_polling()
        self._tasks.append(asyncio.create_task(self.files.run(self._after_file_check)))
        self._start_usage()
        executor = BatchExecutor(lambda: self.batch_api if self._configured else None, self.run_batch_line,
                                 self.metrics)
        self.metrics.batch_store = lambda: self.batch_api.store if self._configured else None
        self._tasks.append(asyncio.create_task(executor.run()))

    def _start_polling(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        poller = LoadPoller(
            self.picker, self.metrics, self.config.routing.poll_interval_s, self.config.routing.poll_timeout_s,
            self.config.routing.unhealthy_after_slow_polls,
        )
        self._poller = asyncio.get_running_loop().create_task(poller.run(self.forwarder.pool))

    def _start_usage(self) -> None:
        if self._usage_task is not None:
            self._usage_task.cancel()
        self._usage_task = asyncio.get_running_loop().create_task(self.usage.run())

    def _after_file_check(self) -> float:
        """The time to the next check of the files, which files.run asks for after every check: the moment to
        write an admin event for a file that check rejected."""
        for name, source in (("config", self.files.config), ("routes", self.files.routes)):
            problem = source.problem if source is not None else None
            if problem is not None and problem != self._rejected.get(name):
                self.audit.write(event("file_rejected", file=name, path=str(source.path), reason=problem))
            self._rejected[name] = problem
        return self.config.routing.reload_interval_s

    def begin_termination(self) -> None:
        """SIGTERM: /ready fails from now on; requests are still served (see drain.py), but none is held any more
        for a model to start: those held get 503 + Retry-After, and their clients retry on another replica."""
        self._terminating = True
        self.hold.close()

    def not_ready_reason(self) -> str | None:
        if self._terminating:
            return "gateway is shutting down"
        if not self._started:
            return "gateway is starting"
        return (self.files.missing() or self.audit.problem
                or getattr(self.limiter, "not_ready_reason", lambda: None)())

    async def shutdown(self) -> None:
        self._started = False
        tasks = [*self._tasks, *(task for task in (self._poller, self._usage_task) if task)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.forwarder.close()
        stop_parser()
        await self.usage.close()  # before the limiter's: it writes on the limiter's connection
        await self.limiter.close()
        self.audit.close()
        self.capture.close()
        if self.tracing is not None:
            self.tracing.shutdown()

    # -- ASGI --------------------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = time.perf_counter()
        headers = dict(scope["headers"])
        # Every request gets its own id, used inside the gateway and upstream; a client's id is only echoed and
        # logged, so two requests sending one id never touch each other.
        own_id = next(_request_ids)
        client_id = headers.get(b"x-request-id")
        client_id = client_id if client_id and request_id.BYTES.match(client_id) else None
        client_trace = _client_trace(scope["headers"])
        trace = client_trace or trace_context.new_trace()
        path, method = scope["path"], scope["method"]
        adapted = _ADAPTED.get(path)
        kind = _PROXIED.get(path) or ("chat" if adapted else None)
        send = DeadlinedSend(send, scope, self.config.timeouts.client_send_s)
        if kind is not None and method == "POST":
            spans = None
            if self.tracing is not None:
                spans = RequestSpans(self.tracing, client_trace, f"{method} {path}")
                trace = spans.trace
            ctx = RequestContext(kind, path, own_id, client_id, started, Admission(self.limiter, self.metrics),
                                 budget_s=client_budget(scope["headers"]), trace=trace,
                                 response_headers=[(b"x-request-id", client_id or own_id),
                                                   (b"x-sluice-request-id", own_id),
                                                   (_TRACE_ID, trace.trace_id.encode())])
            if spans is not None:
                ctx.spans = spans
            proxied_send: Send = send
            if adapted == "responses":
                ctx.adapter = ResponsesAdapter(self.responses, lambda: ctx.tenant, self.running_responses)
            elif adapted == "messages":
                ctx.adapter = MessagesAdapter()
                if b"authorization" not in headers and b"x-api-key" in headers:  # Anthropic's header for the key
                    headers[b"authorization"] = b"Bearer " + headers[b"x-api-key"]
            if ctx.adapter is not None:
                ctx.upstream_path = _CHAT_PATH
                proxied_send = AdaptedSend(send, ctx.adapter)
            client = scope.get("client")
            try:
                await self._proxy(ctx, headers, receive, proxied_send, source=client[0] if client else None)
            except ClientGone:
                pass  # it stopped reading the error it was being sent; _proxy settled and recorded the request
            finally:
                send.cut_off()  # after _proxy settled the request's admission
            return
        error_code = None
        try:
            status, body, content_type = await self._own(scope, headers, receive)
        except GatewayError as err:
            status, body, content_type, error_code = err.status, err.body(), b"application/json", err.code
        try:
            await send_all(send, status, body, [(b"content-type", content_type),
                                                (b"x-request-id", client_id or own_id),
                                                (_TRACE_ID, trace.trace_id.encode())], started)
        except ClientGone:
            send.cut_off()
            status, body = 499, b""
        if self.audit.on and path not in _PROBES:
            authorization = headers.get(b"authorization")
            client = scope.get("client")
            self.audit.write(own_record(
                request_id=own_id, client_id=client_id, trace_id=trace.trace_id, source=client[0] if client else None,
                principal=self.keys.authenticate(authorization.decode(errors="replace")) if authorization else None,
                path=path, status=status, error_code=error_code, bytes_sent=len(body), started=started))

    async def _own(self, scope: dict[str, Any], headers: dict[bytes, bytes], receive: Any) -> tuple[int, bytes, bytes]:
        """An endpoint the gateway answers itself (plain_endpoints.py; stored responses; files and batches)."""
        path, method = scope["path"], scope["method"]
        if path in _BATCH_ROOTS or path.startswith(_BATCH_PREFIXES):
            principal = require_principal(self.keys, headers)
            if principal.admin:
                raise GatewayError(403, "admin keys may not call the inference API; use a tenant's key",
                                   code="admin_key_not_allowed")
            body = b""
            if method == "POST":
                body = await read_body(receive, headers, self.config.batch.max_file_bytes + _FORM_FRAMING_BYTES,
                                       self.config.timeouts.request_read_s)
            query = dict(parse_qsl(scope.get("query_string", b"").decode(errors="replace")))
            return await self.batch_api.serve(method, path, query, principal, headers.get(b"content-type", b""), body)
        if path.startswith(_RESPONSES):
            response_id, _, action = path[len(_RESPONSES):].partition("/")
            if action not in ("", "cancel"):
                raise GatewayError(404, f"no such endpoint: {path}", code="unknown_url")
            if method not in (("POST",) if action else ("GET", "DELETE")):
                raise GatewayError(405, f"{method} is not allowed on {path}")
            principal = require_principal(self.keys, headers)
            if action:
                response = await cancel(self.responses, self.running_responses, principal.tenant, response_id)
            elif method == "DELETE":
                response = await delete(self.responses, principal.tenant, response_id)
            else:
                response = await stored(self.responses, principal.tenant, response_id)
            return 200, json.dumps(response).encode(), b"application/json"
        if path == _USAGE:
            if method != "GET":
                raise GatewayError(405, f"{method} is not allowed on {path}")
            require_admin(self.keys, headers)
            return await usage_answer(self.usage, parse_query(scope.get("query_string", b""), time.time()))
        if path.startswith(_MODELS):
            if method != "GET":
                raise GatewayError(405, f"{method} is not allowed on {path}")
            return model(self, headers, path[len(_MODELS):])
        if method != "GET" and (path in _PROXIED or path in _ADAPTED or path in GET_ROUTES):
            raise GatewayError(405, f"{method} is not allowed on {path}")
        handler = GET_ROUTES.get(path)
        if handler is None:
            raise GatewayError(404, f"no such endpoint: {path}", code="unknown_url")
        return handler(self, headers)

    # -- the proxied endpoints ---------------------------------------------------------------------------
    async def run_batch_line(self, tenant: str, key_id: str, endpoint: str, body: dict[str, Any],
                             batch_id: str) -> tuple[int, bytes, str]:
        """One batch line through the proxied path: (status, answer body, its request id)."""
        own_id = next(_request_ids)
        ctx = RequestContext(BATCH_ENDPOINTS[endpoint], endpoint, own_id, batch_id.encode(), time.perf_counter(),
                             Admission(self.limiter, self.metrics))
        if self.tracing is not None:  # a trace of its own per line: no client started one
            ctx.spans = RequestSpans(self.tracing, None, f"batch line {endpoint}")
            ctx.trace = ctx.spans.trace
            ctx.spans.root.set_attribute("sluice.batch_id", batch_id)
        ctx.principal = self.keys.batch_line(tenant, key_id)
        if ctx.principal is None:
            body_bytes = GatewayError(403, f"the batch's tenant {tenant!r} is no longer in the gateway's config",
                                      code="tenant_not_found").body()
            return 403, body_bytes, own_id.decode()
        answer = _Captured()
        await self._proxy(ctx, {}, _never_disconnects, answer, body=json.dumps(body).encode(), batch_id=batch_id)
        return answer.status, b"".join(answer.chunks), own_id.decode()

    async def _proxy(self, ctx: RequestContext, headers: dict[bytes, bytes], receive: Any, send: Send,
                     body: bytes | None = None, *, batch_id: str | None = None, source: str | None = None) -> None:
        """Serve one proxied request; whatever happens, answer it in the API's format, settle and record it.
        `batch_id`: the batch of a batch line (None: online); `source`: the client's address."""
        watch = AnswerWatch()
        capture = self.capture.watch(ctx)  # None unless a tenant opted in to prompt capture

        async def send_tracked(message: dict[str, Any]) -> None:
            ctx.response_started = True
            watch.saw(message, ctx.stream)
            if ctx.stream and message["type"] == "http.response.body":
                ctx.admission.streamed(message.get("body", b""))
            await send(message)
            if capture is not None:
                capture.saw(message)

        self.metrics.in_flight.inc()
        try:
            await self._serve(ctx, headers, receive, send_tracked, body)
        except GatewayError as err:
            ctx.outcome.status = err.status
            watch.error_code = err.code
            ctx.outcome.overhead_s = time.perf_counter() - ctx.started
            if ctx.response_started:  # a held stream: its headers are out, so the error is its last event
                ctx.outcome.responded = True
                await send({"type": "http.response.body", "body": error_event(err.status, err.message, err.code)})
            else:
                await send_all(send, err.status, err.body(), [_JSON, *ctx.response_headers, *err.headers],
                               ctx.started)
        except Stopped:
            ctx.outcome.finish_reason = "cancelled"  # by the client's cancel: the answer ended in its own format
        except ClientGone:
            ctx.outcome.status = 499
            self.metrics.client_disconnects.inc()
        except Exception:
            # Our own bug: log it with the request id, answer in the API's format rather than a bare 500.
            log.exception("unexpected error in request %s", ctx.request_id.decode(errors="replace"))
            ctx.outcome.status = 500
            watch.error_code = "internal_error"
            if not ctx.response_started:
                body = GatewayError(500, "internal error in the gateway", code="internal_error").body()
                await send_all(send, 500, body, [_JSON, *ctx.response_headers], ctx.started)
        finally:
            self.metrics.in_flight.dec()
            if ctx.adapter is not None:
                ctx.adapter.close()
            admitted = ctx.admission.grant is not None
            await ctx.admission.settle(ctx.outcome.prompt_tokens, ctx.outcome.completion_tokens, ctx.outcome.status)
            record(ctx, self.metrics, self.config.access_log, batch_id)
            self._account(ctx, watch, batch_id, source, admitted)
            if capture is not None:
                capture.done(batch_id)
            if ctx.spans.root.is_recording():
                _end_request_span(ctx, watch.error_code)

    def _account(self, ctx: RequestContext, watch: AnswerWatch, batch_id: str | None, source: str | None,
                 admitted: bool) -> None:
        """The request's audit record, and what it used added to its tenant's usage."""
        mode = "online" if batch_id is None else "batch"
        if self.audit.on:
            self.audit.write(request_record(ctx, watch, batch_id=batch_id, source=source))
        principal, outcome = ctx.principal, ctx.outcome
        if principal is None or principal.admin:
            return
        counts = request_counts(outcome.prompt_tokens, outcome.completion_tokens, outcome.status, admitted)
        if counts:
            hour, route = hour_of(time.time()), outcome.route or UNKNOWN_ROUTE
            self.usage.add({Cell(hour, principal.tenant, route, mode, kind): n for kind, n in counts.items()})

    async def _serve(self, ctx: RequestContext, headers: dict[bytes, bytes], receive: Any, send: Send,
                     body: bytes | None) -> None:
        """Auth, body, parse, then admission; then held while the model has no endpoint, picked and forwarded.
        A batch line comes with its principal and body."""
        if ctx.principal is None:
            with ctx.spans.step("auth") as span:
                ctx.principal = require_principal(self.keys, headers)
                if span.is_recording():
                    span.set_attributes({"sluice.tenant": ctx.principal.tenant, "sluice.key_id": ctx.principal.key_id})
        if ctx.principal.admin:
            # An admin key opens /admin/*; were it also an inference key it would be one with no limits.
            raise GatewayError(403, "admin keys may not call the inference API; use a tenant's key",
                               code="admin_key_not_allowed")
        if body is None:
            body = await read_body(receive, headers, self.config.max_body_bytes, self.config.timeouts.request_read_s)
        if ctx.adapter is not None:
            body = await ctx.adapter.chat_body(body)
        parsed = ctx.parsed = await parse_request_off_loop(body, kind=ctx.kind,
                                                           prefix_chars=self.config.routing.prefix_chars)
        table = self.table
        routes = await self._admit(ctx, table)
        ctx.outcome.route = parsed.model  # a route of the table from here on: a label value, never client input
        # The tenant's priority goes upstream in headers (forwarder.py); a client's own is not passed on.
        parsed.payload.pop("priority", None)
        ctx.strip_usage = parsed.stream and not parsed.client_wants_usage
        if ctx.strip_usage:
            # Usage lets the limiter settle the real token count; the client did not ask, so it is dropped.
            parsed.payload["stream_options"] = {"include_usage": True}
        session = headers.get(self.config.routing.session_header.encode())
        user = parsed.payload.get("user")
        sticky = session.decode(errors="replace") if session else (user if isinstance(user, str) else None)
        prefix = parsed.prefix if routes[0][1].affinity == "prefix" else None

        async def hold_then_forward() -> None:
            if models := starting_models(routes):
                def ready() -> bool:  # read against the table in force now: the operator adds the endpoint
                    return not starting_models(permitted_routes(
                        self.table, parsed.model, ctx.principal.may_use, ctx.kind, ctx.path))

                with ctx.spans.step("cold start hold") as span:
                    await self.hold.wait(ctx, models, ready, send)
                    if span.is_recording():
                        span.set_attributes({"sluice.hold.models": list(models),
                                             "sluice.hold.wait_ms": round((ctx.outcome.held_s or 0) * 1000, 3)})
            rank = ctx.principal.rank
            await self.priority_hold.wait(rank, self.config.priority, lambda: self.picker.saturated(
                self.table, parsed.model, ctx.principal.may_use, ctx.kind), model=parsed.model, tenant=ctx.tenant,
                budget_left=ctx.budget_left, outcome=ctx.outcome, spans=ctx.spans)
            attempts = self.picker.plan(self.table, parsed.model, prefix=prefix, session=sticky,
                                        allowed=ctx.principal.may_use, task=ctx.kind, prefer_idle=rank.urgency < 0,
                                        budget_left=ctx.budget_left)
            await self.forwarder.forward(ctx, attempts, self.config.routing.max_attempts, send)

        await self._until_disconnect(ctx, hold_then_forward, receive)

    async def _admit(self, ctx: RequestContext, table: RoutingTable) -> list[tuple[str, Route]]:
        """The routes the request may take, once it is known to fit a backend's context and the tenant's limits."""
        with ctx.spans.step("route") as span:
            routes = permitted_routes(table, ctx.parsed.model, ctx.principal.may_use, ctx.kind, ctx.path)
            if span.is_recording():
                span.set_attributes({"gen_ai.request.model": ctx.parsed.model,
                                     "sluice.routes": [name for name, _ in routes],
                                     "sluice.backends": [b.name for _, route in routes for b in route.backends]})
        context = max_model_len(routes)
        check_context(ctx.parsed, context)  # before any limit: a request that can never fit is not to be retried
        reservation = reserve(ctx.parsed, context, self.config.default_max_tokens)
        with ctx.spans.step("limits") as span:
            if span.is_recording():
                span.set_attributes({"sluice.reservation.tokens": reservation.tokens,
                                     "sluice.reservation.max_tokens": reservation.max_tokens})
            await ctx.admission.admit(ctx.principal, reservation, ctx.parsed.payload, ctx.response_headers)
            if span.is_recording():
                span.set_attribute("sluice.reservation.granted_tokens", ctx.admission.grant.reserved_tokens)
        return routes

    async def _until_disconnect(
        self, ctx: RequestContext, work: Callable[[], Awaitable[None]], receive: Any,
    ) -> None:
        """Hold and forward, cancelling either as soon as the client disconnects (also before any byte)."""
        task = asyncio.current_task()
        client_left = False

        async def watch() -> None:
            nonlocal client_left
            while (await receive())["type"] != "http.disconnect":
                pass
            if not ctx.outcome.responded:
                client_left = True
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await work()
        except asyncio.CancelledError:
            if not client_left:
                raise
            task.uncancel()
            ctx.outcome.status = 499
            self.metrics.client_disconnects.inc()
        finally:
            watcher.cancel()


def _client_trace(raw_headers: list[tuple[bytes, bytes]]) -> trace_context.TraceContext | None:
    """The client's trace context when valid (else the gateway starts one: never an error)."""
    parents = [value.decode("latin-1") for name, value in raw_headers if name == _TRACEPARENT]
    states = [value.decode("latin-1") for name, value in raw_headers if name == _TRACESTATE]
    return trace_context.read(parents, states)


def _end_request_span(ctx: RequestContext, error_code: str | None) -> None:
    """The server span's attributes, from the request's outcome (never its prompt or completion); then every span
    of the request is built, once it has been answered."""
    outcome, root = ctx.outcome, ctx.spans.root
    attributes: dict[str, Any] = {"http.response.status_code": outcome.status,
                                  "gen_ai.operation.name": OPERATIONS.get(ctx.kind, ctx.kind),
                                  "sluice.request_id": ctx.request_id.decode(), "sluice.attempts": outcome.attempts}
    for name, value in (("gen_ai.request.model", ctx.parsed.model if ctx.parsed else None),
                        ("sluice.tenant", ctx.tenant or None), ("sluice.route", outcome.route or None),
                        ("sluice.backend", outcome.backend or None), ("sluice.model_version", outcome.model_version),
                        ("gen_ai.usage.input_tokens", outcome.prompt_tokens),
                        ("gen_ai.usage.output_tokens", outcome.completion_tokens),
                        ("sluice.held_ms", None if outcome.held_s is None else round(outcome.held_s * 1000, 3)),
                        ("error.type", error_code)):
        if value is not None:
            attributes[name] = value
    if outcome.finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [outcome.finish_reason]
    root.set_attributes(attributes)
    ctx.spans.finish()


class _Captured:
    """A batch line's answer, as the proxied path sends it."""

    def __init__(self) -> None:
        self.status = 0
        self.chunks: list[bytes] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.chunks.append(message.get("body", b""))


async def _never_disconnects() -> dict[str, Any]:
    """A batch line's receive: it has no client to leave."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def _warn_of_tenants_without_models(config: GatewayConfig) -> None:
    if idle := [tenant.name for tenant in config.tenants if not tenant.models]:
        log.warning("gateway config: tenants %s list no models, so their keys may use none (models: [\"*\"] "
                    "allows every model)", ", ".join(idle))
