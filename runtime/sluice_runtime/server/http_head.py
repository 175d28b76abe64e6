"""The serving port's HTTP protocol: uvicorn's httptools one, with the request head bounded as it arrives.

httptools holds a header line until its end and keeps every header of a request, whatever their number or
size, and all of it arrives before the credential is checked. Here the request line, the header count and the
header bytes are bounded (`sluice_contracts.http_bounds`): past one, the client gets 414 or 431 with an OpenAI
error body and the connection is closed. Bytes are counted before the parser sees them, so no more than the
bounds allow is ever held for a head still incomplete.
"""
from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sluice_contracts.http_bounds import MAX_HEADER_BYTES, MAX_HEADER_COUNT, MAX_REQUEST_LINE_BYTES

from .errors import APIError

# The most bytes a head within every bound can take: its request line, its header bytes, and per line the
# name's colon, a space and CRLF (more optional whitespace than that is not worth serving).
MAX_HEAD_BYTES = MAX_REQUEST_LINE_BYTES + MAX_HEADER_BYTES + 4 * (MAX_HEADER_COUNT + 2)
# The request line beside its target and method: a space on each side of the target and "HTTP/1.1".
_LINE_OVERHEAD = len(b"  HTTP/1.1")

_REASONS = {414: "URI Too Long", 431: "Request Header Fields Too Large"}


def _closing_response(status: int, message: str, code: str) -> bytes:
    body = json.dumps(APIError(status, message, code=code).body()).encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


LINE_TOO_LONG = _closing_response(
    414, f"The request line is longer than the server's limit of {MAX_REQUEST_LINE_BYTES} bytes.",
    "request_line_too_long")
TOO_MANY_HEADERS = _closing_response(
    431, f"The request has more than the server's limit of {MAX_HEADER_COUNT} header fields.",
    "request_headers_too_large")
HEADERS_TOO_LARGE = _closing_response(
    431, f"The request's header fields take more than the server's limit of {MAX_HEADER_BYTES} bytes.",
    "request_headers_too_large")


class _Refused(Exception):
    """Raised in a parser callback to stop httptools at once; the refusal is already written."""


class BoundedHeadProtocol(HttpToolsProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # A connection starts with a head; so does whatever follows a complete request.
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._header_bytes = 0
        self._refused = False

    def data_received(self, data: bytes) -> None:
        while data and not self._refused:
            if self._in_head:
                room = MAX_HEAD_BYTES - self._head_bytes
                if room <= 0:
                    self._refuse(HEADERS_TOO_LARGE)
                    return
                # At most what the head may still take; if the head ends inside it, the rest is body (or the next
                # request) and is fed on the next turn.
                piece, data = data[:room], data[room:]
                self._head_bytes += len(piece)
            else:
                piece, data = data, b""
            super().data_received(piece)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.parser.get_method()) + len(self.url) + _LINE_OVERHEAD > MAX_REQUEST_LINE_BYTES:
            self._refuse(LINE_TOO_LONG)
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value)
        if self._header_count > MAX_HEADER_COUNT:
            self._refuse(TOO_MANY_HEADERS)
            raise _Refused
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(HEADERS_TOO_LARGE)
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def send_400_response(self, msg: str) -> None:
        # A refusal raised inside a callback reaches uvicorn as a parse error: the answer is already written.
        if not self._refused:
            super().send_400_response(msg)

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()
