"""Reading a client's request body and sending to it, over ASGI, each under a deadline."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from .client_protocol import ABORT_EXTENSION
from .errors import GatewayError


class ClientGone(Exception):
    """The client disconnected while the gateway was still reading its request, or stopped reading the answer."""


class ClientStalled(ClientGone):
    """A send to the client did not complete within its deadline: the client stopped reading."""


class DeadlinedSend:
    """The ASGI `send` with a deadline on each call. A send waits while the client's socket is full (flow
    control), which a client that stops reading makes forever; past `timeout_s` it raises ClientStalled, and
    every later send is dropped. The caller settles the request, then `cut_off()` aborts the connection, which
    frees its buffers at once."""

    def __init__(self, send: Any, scope: dict[str, Any], timeout_s: float) -> None:
        self._send = send
        self._timeout_s = timeout_s
        self._abort: Callable[[], None] | None = scope.get("extensions", {}).get(ABORT_EXTENSION)
        self.stalled = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if self.stalled:
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._send(message)
        except TimeoutError:
            self.stalled = True
            raise ClientStalled from None

    def cut_off(self) -> None:
        if self.stalled and self._abort is not None:
            self._abort()


async def read_body(receive: Any, headers: dict[bytes, bytes], limit: int, timeout_s: float) -> bytes:
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
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_all(send: Any, status: int, body: bytes, headers: list, started: float) -> None:
    overhead = f"{(time.perf_counter() - started) * 1000:.3f}".encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        *headers, (b"content-length", str(len(body)).encode()), (b"x-sluice-overhead-ms", overhead),
    ]})
    await send({"type": "http.response.body", "body": body})
