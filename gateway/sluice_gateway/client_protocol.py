"""uvicorn's httptools protocol with the client deadlines and head bounds uvicorn lacks.

uvicorn closes a kept-alive connection after `timeout_keep_alive`, but only once it has answered a request
on it: a connection that never sends a byte, or that sends its headers a byte at a time, is held forever.
Here the idle timer also runs from the moment a connection is accepted, and a request's headers must be
complete within `request_read_s` (the body has its own deadline in the app, where it is read).

A client that stops reading its response is cut off by the app (client_io.py) through `ABORT_EXTENSION`.

Nor does httptools bound a request's head: header lines arrive before any key is checked, and it buffers a
header line of any length. The request line, the header count and the header bytes are bounded here
(`sluice_contracts.http_bounds`); past one the client gets 414 or 431 and the connection is closed.
"""
from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sluice_contracts.http_bounds import MAX_HEADER_BYTES, MAX_HEADER_COUNT, MAX_REQUEST_LINE_BYTES

from .errors import error_body

# A head still incomplete after this many bytes has passed a bound, whichever (": " and CRLF per line aside).
_MAX_HEAD_BYTES = MAX_REQUEST_LINE_BYTES + MAX_HEADER_BYTES + 4 * (MAX_HEADER_COUNT + 2)
# The kernel's send buffer per client connection. Left to autotune, a stream to a client that stops reading pins
# megabytes of kernel memory; this is ample for a stream's pace, and the send deadline does the rest.
_SEND_BUFFER_BYTES = 256 * 1024
_REASONS = {408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


def closing_response(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error response with an OpenAI error body, for a connection about to be closed."""
    body = error_body(status, message, code=code)
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
            % (status, _REASONS[status], len(body)) + body)


_TIMEOUT_RESPONSE = closing_response(408, "the request headers did not arrive in time", "request_timeout")
LINE_TOO_LONG = closing_response(
    414, f"the request line is longer than {MAX_REQUEST_LINE_BYTES} bytes", "request_line_too_long")
TOO_MANY_HEADERS = closing_response(
    431, f"the request has more than {MAX_HEADER_COUNT} header fields", "request_headers_too_large")
HEADERS_TOO_LARGE = closing_response(
    431, f"the request's header fields take more than {MAX_HEADER_BYTES} bytes", "request_headers_too_large")


# The ASGI scope extension through which the app cuts off a client that stopped reading (client_io.py).
ABORT_EXTENSION = "sluice.abort"


class _HeadRefused(Exception):
    """Raised inside httptools' callbacks, which stops the parser; the response is already written."""


class ClientProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, request_read_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_read_s = request_read_s
        self._head_deadline: asyncio.TimerHandle | None = None
        self._in_head = False
        self._head_bytes = 0
        self._header_count = 0
        self._header_bytes = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER_BYTES)
        # Armed as after a response; the first byte of a request cancels it (uvicorn's data_received).
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # httptools holds a header line until it ends. A head still incomplete after this read is made of all
        # of it (a read that completed the head may carry a body of any size: that is the body's to bound).
        if self._in_head and self._head_bytes > _MAX_HEAD_BYTES and not self._refused:
            self._refuse(HEADERS_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._header_count, self._header_bytes = True, 0, 0, 0
        self._head_deadline = self.loop.call_later(self._request_read_s, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_REQUEST_LINE_BYTES:
            self._refuse(LINE_TOO_LONG)
            raise _HeadRefused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value)
        if self._header_count > MAX_HEADER_COUNT:
            self._refuse(TOO_MANY_HEADERS)
            raise _HeadRefused
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(HEADERS_TOO_LARGE)
            raise _HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_deadline()
        # uvicorn hands the app this scope in its on_headers_complete: it carries the way to abort the connection.
        self.scope["extensions"] = {**self.scope.get("extensions", {}), ABORT_EXTENSION: self.transport.abort}
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # a refusal raised inside the parser reaches uvicorn as a parse error
            super().send_400_response(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        self._cancel_head_deadline()
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()

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
