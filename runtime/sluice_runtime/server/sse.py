"""Server-sent events: the framing OpenAI clients parse, and a response that always closes its source."""
from __future__ import annotations

import asyncio
import json

from starlette.responses import StreamingResponse

from .disconnect import ClientStalled
from .errors import APIError

DONE = "data: [DONE]\n\n"
# A comment line: SSE clients skip it, and it shows a proxy that the stream is alive.
HEARTBEAT = ": generating\n\n"


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def usage_event(base: dict, prompt_tokens: int, completion_tokens: int) -> str:
    """The trailing chunk of `stream_options.include_usage`: no choices, the request's token counts."""
    return event({**base, "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                   "completion_tokens": completion_tokens,
                                                   "total_tokens": prompt_tokens + completion_tokens}})


def error_event(err: APIError) -> str:
    """A failure after the 200 status went out: an `error` object, which OpenAI clients raise as an APIError."""
    return event(err.body())


class SSEResponse(StreamingResponse):
    """An event stream that gives up on a client that stops reading.

    The server writes no further than the socket's buffers take (uvicorn waits for them to drain), so a
    write that waits `idle_timeout` seconds means the client has read nothing for that long: the stream
    ends with ClientStalled, and closing its events aborts the engine request and frees its KV blocks.
    """

    media_type = "text/event-stream"

    def __init__(self, events, idle_timeout: float):
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._idle_timeout = idle_timeout

    async def stream_response(self, send) -> None:
        async def send_while_read(message) -> None:
            try:
                await asyncio.wait_for(send(message), self._idle_timeout)
            except asyncio.TimeoutError:
                raise ClientStalled() from None

        await super().stream_response(send_while_read)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # If the client left while a chunk was being sent, the generator is parked at a yield and
            # was not cancelled; closing it here aborts the engine request now rather than at GC.
            await self.body_iterator.aclose()
