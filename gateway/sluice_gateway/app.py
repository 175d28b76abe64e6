"""The gateway's HTTP front: a plain ASGI app (no framework on the hot path, for latency).

Request path: auth → body → parse → model permission → route lookup → context check → limits → pick and
forward.
Every response carries `x-request-id` and `x-sluice-overhead-ms`; every proxied request writes one JSON
access-log line (with the key's id, never the key).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import time
import uuid
from pathlib import Path
from typing import Any

from .auth import KeyStore, Principal
from .config import START_ONLY_FIELDS, GatewayConfig
from .errors import GatewayError
from .admission import Admission
from .cost import check_context, reserve
from .limits import Limiter
from .limits.memory import MemoryLimiter
from .limits.redis import RedisLimiter
from .load_poller import LoadPoller
from .metrics import GatewayMetrics
from .picker import Picker
from .proxy import Outcome, Upstream
from .request import ParsedRequest, parse_request
from .routing_table import Route, RoutingTable, max_model_len
from .watched_files import WatchedFiles

log = logging.getLogger("sluice_gateway")
access_log = logging.getLogger("sluice_gateway.access")

_PROXIED = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}
_JSON = (b"content-type", b"application/json")
# A client's request id is echoed and logged when it is short and plain; it never names the request inside.
_CLIENT_ID = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,128}$")
# Request ids: a random per-process prefix and a counter, unique without a system call per request.
_request_ids = (f"{uuid.uuid4().hex[:16]}{n:08x}".encode() for n in itertools.count())


class _ClientGone(Exception):
    """The client disconnected while the gateway was still reading its request."""


class GatewayApp:
    """Serves from `config_path` (and the routing table and credential it names), kept in force while it runs.

    Until a usable config has been read the gateway has no keys: it answers /health, fails /ready, refuses
    every API call with 401 and keeps watching the file.
    """

    def __init__(self, config_path: Path, routes_path: Path | None = None) -> None:
        self.metrics = GatewayMetrics()
        self.metrics.ready.set_function(lambda: 1 if self.not_ready_reason() is None else 0)
        self.table = RoutingTable()
        self._started = False
        self._terminating = False
        self._tasks: list[asyncio.Task] = []
        self._poller: asyncio.Task | None = None
        self._configure(GatewayConfig())  # no tenants, no keys: in force only until the file is read
        self._configured = False
        self.files = WatchedFiles(config_path, routes_path, self.metrics, self.apply_config, self.apply_table)
        self.files.check()

    def _configure(self, config: GatewayConfig) -> None:
        self.config = config
        self.keys = KeyStore(config)
        self.picker = Picker(config.routing)
        self.picker.sync(self.table)
        self.upstream = Upstream(
            config.timeouts, self.picker, self.metrics, credential=lambda: self.files.credential_header,
            max_response_bytes=config.max_response_bytes,
        )
        self.limiter: Limiter = (
            RedisLimiter(config.redis, lease_ttl_s=config.timeouts.total_s + 60)
            if config.redis is not None else MemoryLimiter()
        )
        if self._started:
            self._start_polling()

    def apply_config(self, config: GatewayConfig) -> None:
        if not self._configured:
            # The stand-in served no request (it has no keys), so all of it can be replaced.
            self.upstream.close()
            self._configure(config)
            self._configured = True
            log.info("gateway config loaded: %d tenants, %d admin keys", len(config.tenants), len(config.admin_keys))
            return
        kept = [name for name in START_ONLY_FIELDS if getattr(config, name) != getattr(self.config, name)]
        if kept:
            log.warning("gateway config: changes to %s take effect at the next restart", ", ".join(kept))
            config = config.model_copy(update={name: getattr(self.config, name) for name in kept})
        self.config = config
        self.keys = KeyStore(config)
        log.info("gateway config reloaded: %d tenants, %d admin keys", len(config.tenants), len(config.admin_keys))

    def apply_table(self, table: RoutingTable) -> None:
        self.picker.sync(table)
        self.table = table
        self.metrics.table_generation.set(table.generation)

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def startup(self) -> None:
        self._started = True
        self._start_polling()
        self._tasks.append(asyncio.create_task(self.files.run(lambda: self.config.routing.reload_interval_s)))

    def _start_polling(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        poller = LoadPoller(
            self.picker, self.metrics, self.config.routing.poll_interval_s, self.config.routing.poll_timeout_s
        )
        self._poller = asyncio.get_running_loop().create_task(poller.run(self.upstream.pool))

    def begin_termination(self) -> None:
        """SIGTERM: /ready fails from now on; requests are still served (see drain.py)."""
        self._terminating = True

    def not_ready_reason(self) -> str | None:
        if self._terminating:
            return "gateway is shutting down"
        if not self._started:
            return "gateway is starting"
        return self.files.missing()

    async def shutdown(self) -> None:
        self._started = False
        tasks = [*self._tasks, *([self._poller] if self._poller else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.upstream.close()
        await self.limiter.close()

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
        client_id = client_id if client_id and _CLIENT_ID.match(client_id) else None
        request_id = client_id or own_id  # what the response says
        path, method = scope["path"], scope["method"]
        kind = _PROXIED.get(path)
        if kind is not None and method == "POST":
            await self._proxy(kind, path, headers, own_id, client_id, started, receive, send)
            return
        try:
            if method != "GET" and (kind is not None or path in _GET_ROUTES):
                raise GatewayError(405, f"{method} is not allowed on {path}")
            handler = _GET_ROUTES.get(path)
            if handler is None:
                raise GatewayError(404, f"no such endpoint: {path}", code="unknown_url")
            status, body, content_type = handler(self, headers)
        except GatewayError as err:
            status, body, content_type = err.status, err.body(), b"application/json"
        await _send_all(send, status, body, [(b"content-type", content_type), (b"x-request-id", request_id)], started)

    # -- the proxied endpoints ---------------------------------------------------------------------------
    async def _proxy(
        self, kind: str, path: str, headers: dict[bytes, bytes], request_id: bytes, client_id: bytes | None,
        started: float, receive: Any, send: Any,
    ) -> None:
        outcome = Outcome()
        principal: Principal | None = None
        admission = Admission(self.limiter, self.metrics)
        response_headers = [(b"x-request-id", client_id or request_id), (b"x-sluice-request-id", request_id)]
        response_started = False
        stream = False

        async def send_tracked(message: dict[str, Any]) -> None:
            nonlocal response_started
            response_started = True
            if stream and message["type"] == "http.response.body":
                admission.streamed(message.get("body", b""))
            await send(message)

        self.metrics.in_flight.inc()
        try:
            principal = self._principal(headers)
            body = await _read_body(receive, headers, self.config.max_body_bytes, self.config.timeouts.request_read_s)
            parsed = parse_request(body, kind=kind, prefix_chars=self.config.routing.prefix_chars)
            table = self.table
            outcome.route = parsed.model
            routes = await self._admit(table, principal, parsed, admission, response_headers)
            stream = parsed.stream
            strip_usage = parsed.stream and not parsed.client_wants_usage
            if strip_usage:
                # Usage lets the limiter settle the real token count; the client did not ask, so it is dropped.
                parsed.payload["stream_options"] = {"include_usage": True}
            session = headers.get(self.config.routing.session_header.encode())
            user = parsed.payload.get("user")
            sticky = session.decode(errors="replace") if session else (user if isinstance(user, str) else None)
            attempts = self.picker.plan(
                table, parsed.model, prefix=parsed.prefix if routes[0][1].affinity == "prefix" else None,
                session=sticky, allowed=principal.may_use,
            )
            await self._forward_until_disconnect(
                attempts, path, parsed.payload, parsed.stream, strip_usage, request_id, started,
                response_headers, receive, send_tracked, outcome,
            )
        except GatewayError as err:
            outcome.status = err.status
            outcome.overhead_s = time.perf_counter() - started
            await _send_all(send, err.status, err.body(), [_JSON, *response_headers, *err.headers], started)
        except _ClientGone:
            outcome.status = 499
            self.metrics.client_disconnects.inc()
        except Exception:
            # Our own bug: log it with the request id, answer in the API's format rather than a bare 500.
            log.exception("unexpected error in request %s", request_id.decode(errors="replace"))
            outcome.status = 500
            if not response_started:
                body = GatewayError(500, "internal error in the gateway", code="internal_error").body()
                await _send_all(send, 500, body, [_JSON, *response_headers], started)
        finally:
            self.metrics.in_flight.dec()
            await admission.settle(outcome.prompt_tokens, outcome.completion_tokens, outcome.status)
            self._record(principal, outcome, request_id, started, client_id)

    def _principal(self, headers: dict[bytes, bytes]) -> Principal:
        authorization = headers.get(b"authorization")
        principal = self.keys.authenticate(authorization.decode(errors="replace") if authorization else None)
        if principal is None:
            message = ("Missing API key: send it as 'Authorization: Bearer KEY'" if not authorization
                       else "Incorrect API key provided")
            raise GatewayError(401, message, code="invalid_api_key")
        return principal

    async def _admit(
        self, table: RoutingTable, principal: Principal, parsed: ParsedRequest, admission: Admission,
        response_headers: list,
    ) -> list[tuple[str, Route]]:
        """The routes the request may take, once it is known to fit a backend's context and the tenant's limits."""
        routes = self._routes(table, principal, parsed.model)
        context = max_model_len(routes)
        check_context(parsed, context)  # before any limit: a request that can never fit is not to be retried
        reservation = reserve(parsed, context, self.config.default_max_tokens)
        await admission.admit(principal, reservation, parsed.payload, response_headers)
        return routes

    def _routes(self, table: RoutingTable, principal: Principal, model: str) -> list[tuple[str, Route]]:
        """The routes that may serve this tenant's request. 403 comes before 404, so that whether a model
        exists is told only to keys that may use it."""
        if not principal.may_use(model):
            raise GatewayError(403, f"Your key may not use the model '{model}'", param="model",
                               code="model_not_allowed")
        routes = table.reachable(model, principal.may_use)
        if routes:
            return routes
        if table.route(model) is not None:  # it exists, but only behind backends that are models the key may not use
            raise GatewayError(403, f"Every backend of the model '{model}' is a model your key may not use",
                               param="model", code="model_not_allowed")
        raise GatewayError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")

    async def _forward_until_disconnect(
        self, attempts: Any, path: str, payload: dict, stream: bool, strip_usage: bool, request_id: bytes,
        started: float, response_headers: list, receive: Any, send: Any, outcome: Outcome,
    ) -> None:
        """Forward, cancelling the upstream work as soon as the client disconnects (also before any byte)."""
        task = asyncio.current_task()
        client_left = False

        async def watch() -> None:
            nonlocal client_left
            while (await receive())["type"] != "http.disconnect":
                pass
            if not outcome.responded:
                client_left = True
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.upstream.forward(
                attempts, self.config.routing.max_attempts, path, payload, stream=stream, strip_usage=strip_usage,
                request_id=request_id.decode(errors="replace"), started=started,
                response_headers=response_headers, send=send, outcome=outcome,
            )
        except asyncio.CancelledError:
            if not client_left:
                raise
            task.uncancel()
            outcome.status = 499
            self.metrics.client_disconnects.inc()
        finally:
            watcher.cancel()

    def _record(
        self, principal: Principal | None, outcome: Outcome, request_id: bytes, started: float,
        client_id: bytes | None = None,
    ) -> None:
        tenant = principal.tenant if principal else ""
        self.metrics.requests.labels(outcome.route, outcome.backend, tenant, str(outcome.status)).inc()
        self.metrics.overhead.observe(outcome.overhead_s)
        if outcome.prompt_tokens is not None:
            self.metrics.tokens.labels(tenant, "prompt").inc(outcome.prompt_tokens)
            self.metrics.tokens.labels(tenant, "completion").inc(outcome.completion_tokens or 0)
        if self.config.access_log and access_log.isEnabledFor(logging.INFO):
            access_log.info(json.dumps({
                "request_id": request_id.decode(errors="replace"),
                "client_request_id": client_id.decode() if client_id else None,
                "tenant": tenant,
                "key_id": principal.key_id if principal else None,
                "route": outcome.route,
                "backend": outcome.backend,
                "endpoint": outcome.endpoint,
                "status": outcome.status,
                "attempts": outcome.attempts,
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens,
                "finish_reason": outcome.finish_reason,
                "overhead_ms": round(outcome.overhead_s * 1000, 3),
                "upstream_ms": _ms(outcome.upstream_s),
                "ttft_ms": _ms(outcome.ttft_s),
                "total_ms": round((time.perf_counter() - started) * 1000, 3),
            }))

    # -- plain endpoints ---------------------------------------------------------------------------------
    def _models(self, headers: dict[bytes, bytes]) -> tuple[int, bytes, bytes]:
        principal = self._principal(headers)
        names = [n for n in self.table.public_names() if principal.may_use(n)]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "sluice"} for n in names]
        return 200, json.dumps({"object": "list", "data": data}).encode(), b"application/json"

    def _health(self, headers: dict[bytes, bytes]) -> tuple[int, bytes, bytes]:
        return 200, b'{"status":"ok"}', b"application/json"

    def _readiness(self, headers: dict[bytes, bytes]) -> tuple[int, bytes, bytes]:
        reason = self.not_ready_reason()
        if reason is not None:  # the details (paths, validation errors) are in the log, not on the API port
            raise GatewayError(503, reason, code="not_ready")
        body = {"status": "ready", "generation": self.table.generation, "routes": len(self.table.routes)}
        return 200, json.dumps(body).encode(), b"application/json"

    def _admin(self, headers: dict[bytes, bytes]) -> Principal:
        principal = self._principal(headers)
        if not principal.admin:
            raise GatewayError(403, "this endpoint needs an admin key", code="admin_only")
        return principal

    def _admin_routes(self, headers: dict[bytes, bytes]) -> tuple[int, bytes, bytes]:
        self._admin(headers)
        return 200, self.table.to_json().encode(), b"application/json"

    def _admin_endpoints(self, headers: dict[bytes, bytes]) -> tuple[int, bytes, bytes]:
        self._admin(headers)
        now = time.monotonic()
        data = [
            {"url": s.url, "available": s.available(now), "healthy": s.healthy, "waiting": s.waiting,
             "running": s.running, "kv_cache_usage": s.kv_cache_usage, "in_flight": s.in_flight,
             "ejected_for_s": round(max(s.ejected_until - now, 0.0), 3),
             "polled_s_ago": round(now - s.polled_at, 3) if s.polled_at else None}
            for s in self.picker.endpoints()
        ]
        return 200, json.dumps({"endpoints": data}).encode(), b"application/json"


_GET_ROUTES = {
    "/v1/models": GatewayApp._models,
    "/health": GatewayApp._health,
    "/ready": GatewayApp._readiness,
    "/admin/routes": GatewayApp._admin_routes,
    "/admin/endpoints": GatewayApp._admin_endpoints,
}


async def _read_body(receive: Any, headers: dict[bytes, bytes], limit: int, timeout_s: float) -> bytes:
    """The whole body, within `timeout_s` (a client trickling it would hold a connection and its buffer)."""
    too_large = GatewayError(413, f"request body is larger than the gateway's limit of {limit} bytes")
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    try:
        async with asyncio.timeout(timeout_s):
            return await _receive_body(receive, limit, too_large)
    except TimeoutError:
        raise GatewayError(408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout",
                           headers=[(b"connection", b"close")]) from None


async def _receive_body(receive: Any, limit: int, too_large: GatewayError) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_all(send: Any, status: int, body: bytes, headers: list, started: float) -> None:
    overhead = f"{(time.perf_counter() - started) * 1000:.3f}".encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        *headers, (b"content-length", str(len(body)).encode()), (b"x-sluice-overhead-ms", overhead),
    ]})
    await send({"type": "http.response.body", "body": body})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
