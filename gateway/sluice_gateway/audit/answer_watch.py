"""What a client was sent, as the audit trail tells it: the status, when its first byte of answer went out, how
much of it went out, and the error code of an error answer (the gateway's own or an upstream's)."""
from __future__ import annotations

import time
from typing import Any

from ..relay import upstream_code

# An upstream error body is short; a longer first chunk is no error body worth reading a code from.
_MAX_ERROR_BODY = 64 * 1024


class AnswerWatch:
    def __init__(self) -> None:
        self.status = 0
        self.first_byte_at: float | None = None  # time.perf_counter()
        self.bytes_sent = 0
        self.events_sent = 0  # of a stream: its data events (keepalive comments are none)
        self.error_code: str | None = None

    def saw(self, message: dict[str, Any], stream: bool) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        body = message.get("body", b"")
        if not body:
            return
        if stream:
            # The relay sends whole events, so each starts a chunk or follows a blank line.
            events = body.count(b"\n\ndata:") + body.startswith(b"data:")
            if events and self.first_byte_at is None:
                self.first_byte_at = time.perf_counter()
            self.events_sent += events
        elif self.first_byte_at is None:
            self.first_byte_at = time.perf_counter()
            if self.status >= 400 and self.error_code is None and len(body) <= _MAX_ERROR_BODY:
                self.error_code = upstream_code(body)
        self.bytes_sent += len(body)
