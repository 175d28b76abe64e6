"""The connection pool the gateway talks to runtimes through: keep-alive HTTP/1.1 on asyncio protocols and httptools.

General-purpose clients cost several times more CPU per request than the rest of the gateway together
(measured: ~150 µs vs ~20 µs per request on one core), and the gateway only ever needs one shape of
exchange: a request with a JSON body to a known endpoint, a response read whole or chunk by chunk.
Each request goes out in one write; responses are parsed by httptools; read buffers are bounded (reading
from the upstream pauses while the client is slower), idle connections are pooled per endpoint, capped
and expired, and a connection whose response was not read to the end is closed, never reused.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024


class UpstreamError(Exception):
    """The exchange failed; `connect` tells whether the request can be known not to have been sent."""

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect


class ResponseTooLarge(UpstreamError):
    """The response body is larger than the caller is willing to hold."""


class _Connection(asyncio.Protocol):
    def __init__(self, pool: "ConnectionPool", key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.received_any = False
        self.reusable = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed response from upstream: {exc}"))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self.pool._forget(self)
        response = self.response
        if response is not None and not response.complete:
            self._fail(UpstreamError("upstream closed the connection", connect=not self.received_any))

    # -- httptools callbacks ---------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        response = self.response
        response.status = self.parser.get_status_code()
        if not response.headers_ready.done():
            response.headers_ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.response._feed(body)

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        self.response._finish()

    # -- helpers ---------------------------------------------------------------------------------------
    def _fail(self, error: UpstreamError) -> None:
        if self.response is not None:
            self.response._fail(error)

    def start(self, request: bytes) -> "UpstreamResponse":
        self.parser = httptools.HttpResponseParser(self)
        self.received_any = False
        self.reusable = False
        self.response = UpstreamResponse(self)
        self.transport.write(request)
        return self.response


class UpstreamResponse:
    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        loop = asyncio.get_running_loop()
        self.headers_ready: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self._paused = False
        self._settled = False

    @property
    def finished(self) -> bool:
        """The whole response has arrived and only buffered bytes remain to be taken."""
        return self.complete and not self._chunks

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        self._error = error
        if not self.headers_ready.done():
            self.headers_ready.set_exception(error)
            self.headers_ready.exception()  # consumed here; the caller sees it through await
        self._wake()

    async def iter_chunks(self):
        """Body bytes as they arrive (whatever is buffered, joined), until the response ends."""
        while True:
            if self._chunks:
                data = b"".join(self._chunks)
                self._chunks.clear()
                self._buffered = 0
                if self._paused and not self.complete:
                    self._paused = False
                    self._connection.transport.resume_reading()
                yield data
                continue
            if self.complete:
                return
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None

    async def read(self, limit: int) -> bytes:
        """The whole body, refused past `limit` bytes (declared or received) before more is held."""
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ResponseTooLarge(f"the response declares {declared} bytes, more than {limit}")
        chunks, size = [], 0
        async for chunk in self.iter_chunks():
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge(f"the response is larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def release(self) -> None:
        """Hand the connection back: to the pool when the response was read whole, else closed."""
        if self._settled:
            return
        self._settled = True
        connection = self._connection
        connection.response = None
        if self.complete and connection.reusable and self._error is None:
            if self._paused:  # the answer's last bytes passed the buffer's bound: the next one must be read
                connection.transport.resume_reading()
            connection.pool._park(connection)
        else:
            connection.transport.close()

    def close(self) -> None:
        """Drop the connection, e.g. because the client left: the upstream sees the disconnect."""
        if not self._settled:
            self._settled = True
            self._connection.response = None
            self._connection.transport.close()


class ConnectionPool:
    def __init__(self, connect_timeout_s: float, max_idle_per_endpoint: int = 256, idle_ttl_s: float = 30.0) -> None:
        self._connect_timeout = connect_timeout_s
        self._max_idle = max_idle_per_endpoint
        self._idle_ttl = idle_ttl_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._last_sweep = time.monotonic()

    async def request(
        self, method: str, base_url: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        """Send one request and wait for the response headers (the caller bounds the wait)."""
        parts = urlsplit(base_url)
        host, port = parts.hostname, parts.port or 80
        lines = [f"{method} {path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        key = (host, port)
        connection = self._take_idle(key)
        reused = connection is not None
        if connection is None:
            connection = await self._connect(key)
        while True:
            response = connection.start(request)
            try:
                await response.headers_ready
                return response
            except UpstreamError as exc:
                response.close()
                if not (reused and exc.connect):
                    raise
            except BaseException:
                response.close()
                raise
            # A pooled connection the server had already closed: the request never reached it, so resend.
            reused = False
            connection = await self._connect(key)

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(lambda: _Connection(self, key), key[0], key[1])
        except TimeoutError:
            raise UpstreamError(f"connecting to {key[0]}:{key[1]} timed out", connect=True) from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {exc.strerror or exc}", connect=True) from None
        return connection

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.transport.is_closing():
                return connection
        return None

    def _park(self, connection: _Connection) -> None:
        now = time.monotonic()
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= self._max_idle:
            connection.transport.close()
            return
        connection.idle_since = now
        idle.append(connection)
        if now - self._last_sweep > self._idle_ttl / 3:
            self._sweep(now)

    def _forget(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)
        if idle == []:
            del self._idle[connection.key]

    def _sweep(self, now: float) -> None:
        """Close connections idle too long, so endpoints that left the table leave no sockets behind."""
        self._last_sweep = now
        for idle in list(self._idle.values()):
            for connection in [c for c in idle if now - c.idle_since > self._idle_ttl]:
                connection.transport.close()

    def close(self) -> None:
        for idle in list(self._idle.values()):
            for connection in list(idle):
                connection.transport.close()
        self._idle.clear()
