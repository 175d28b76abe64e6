"""uvicorn's httptools protocol with the two client deadlines uvicorn lacks.

uvicorn closes a kept-alive connection after `timeout_keep_alive`, but only once it has answered a request
on it: a connection that never sends a byte, or that sends its headers a byte at a time, is held forever.
Here the idle timer also runs from the moment a connection is accepted, and a request's headers must be
complete within `request_read_s` (the body has its own deadline in the app, where it is read).
"""
from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .errors import error_body

_TIMEOUT_BODY = error_body(408, "the request headers did not arrive in time", code="request_timeout")
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    + b"content-length: %d\r\n\r\n" % len(_TIMEOUT_BODY) + _TIMEOUT_BODY
)


class ClientProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, request_read_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_read_s = request_read_s
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Armed as after a response; the first byte of a request cancels it (uvicorn's data_received).
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_deadline = self.loop.call_later(self._request_read_s, self._head_timed_out)

    def on_headers_complete(self) -> None:
        self._cancel_head_deadline()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # never inside a response still being sent
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()
