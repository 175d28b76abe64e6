"""APIs served by translating to chat completions and back: OpenAI's Responses (responses_api.py) and
Anthropic's Messages (messages_api.py).

A request in another API's format becomes a chat-completions body before it is parsed, so it takes the chat
path whole: the same limits, token reservation, routes, priority and usage accounting, and any backend that
serves chat (the runtime, vLLM) serves it. Its answer is translated on the way out, in `AdaptedSend`, which sits
between the gateway's relay and the client: whole answers (and every error, the gateway's own included) are
held and rewritten, streams are rewritten event by event.
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import pydantic_core

from .errors import GatewayError

Send = Callable[[dict[str, Any]], Awaitable[None]]


class Adapter(Protocol):
    """One request of a translated API, from its body to the last byte of its answer."""

    async def chat_body(self, body: bytes) -> bytes:
        """The chat-completions body for this request's body; GatewayError(400) naming the field it refuses."""

    async def answer(self, chat: dict[str, Any]) -> bytes:
        """The API's whole answer for a chat completion."""

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        """The API's error body for an OpenAI error object (message, type, param, code)."""

    async def events(self, chunk: dict[str, Any]) -> bytes:
        """The API's stream events for one chat-completion chunk."""

    async def end(self) -> bytes:
        """The API's closing events, once the chat stream is done."""

    def stream_error(self, error: dict[str, Any]) -> bytes:
        """The API's last event for an error mid-stream."""

    @property
    def stopped(self) -> bool:
        """The answer was ended by the gateway (a cancelled response): no more of the upstream is wanted."""

    def close(self) -> None:
        """The request is over, however it ended."""


class Stopped(Exception):
    """Raised from a send once an adapter has ended its answer early; the relay then drops the upstream."""


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class AdaptedSend:
    """The ASGI send of a translated request: chat answers in, the API's answers out."""

    def __init__(self, send: Send, adapter: Adapter) -> None:
        self._send = send
        self._adapter = adapter
        self._start: dict[str, Any] | None = None
        self._streaming = False
        self._held: list[bytes] = []
        self._pending = b""
        self._ended = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            self._streaming = (message["status"] == 200
                               and headers.get(b"content-type", b"").startswith(b"text/event-stream"))
            if self._streaming:
                await self._send(message)
            else:
                self._start = message
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        more = message.get("more_body", False)
        if self._streaming:
            await self._stream_body(message.get("body", b""), more)
            return
        self._held.append(message.get("body", b""))
        if not more:
            await self._whole(b"".join(self._held))

    async def _whole(self, data: bytes) -> None:
        start = self._start or {"status": 500, "headers": []}
        status = start["status"]
        if status == 200:
            try:
                body = await self._adapter.answer(json.loads(data))
            except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                status, body = 502, self._adapter.error(502, _error_object(502, "the model server's answer is not "
                                                                               "a chat completion"))
        else:
            body = self._adapter.error(status, _error_of(data, status))
        headers = [(k, v) for k, v in start.get("headers", []) if k not in (b"content-length", b"content-type")]
        await self._send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
        await self._send({"type": "http.response.body", "body": body})

    async def _stream_body(self, data: bytes, more: bool) -> None:
        self._pending += data
        out: list[bytes] = []
        while not self._ended and (cut := self._pending.find(b"\n\n")) >= 0:
            event, self._pending = self._pending[:cut], self._pending[cut + 2:]
            out.append(await self._event(event))
        if not more and not self._ended:
            if self._pending.strip():
                out.append(await self._event(self._pending))
            self._pending = b""
            if not self._ended:  # the upstream ended without [DONE]: cut short
                out.append(self._adapter.stream_error(_error_object(502, "the model server ended the stream early")))
                self._ended = True
        stopped = self._adapter.stopped and not self._ended
        if stopped:
            out.append(await self._adapter.end())
            self._ended = True
        body = b"".join(out)
        if body or not more or stopped:
            await self._send({"type": "http.response.body", "body": body, "more_body": more and not stopped})
        if stopped:
            raise Stopped

    async def _event(self, event: bytes) -> bytes:
        if not event.strip() or event.startswith(b":"):  # blank, or a keepalive comment: passed on
            return event + b"\n\n" if event.strip() else b""
        data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if data == b"[DONE]":
            self._ended = True
            return await self._adapter.end()
        try:
            chunk = json.loads(data)
        except ValueError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        if isinstance(chunk.get("error"), dict):
            self._ended = True
            return self._adapter.stream_error(chunk["error"])
        return await self._adapter.events(chunk)


def _error_object(status: int, message: str) -> dict[str, Any]:
    return json.loads(GatewayError(status, message).body())["error"]


def _error_of(data: bytes, status: int) -> dict[str, Any]:
    """The OpenAI error object of an error body, the gateway's or an upstream's."""
    try:
        error = json.loads(data)["error"]
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error
    except (ValueError, KeyError, TypeError):
        pass
    return _error_object(status, f"the model server answered {status}")


def refuse(param: str, message: str, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def unsupported(param: str, what: str = "") -> GatewayError:
    return GatewayError(400, f"{param}{what} is not supported by this server", param=param,
                        code="unsupported_parameter")


def chat_body(chat: dict[str, Any], given: dict[str, Any]) -> bytes:
    """The chat-completions body, streamed when the request is: usage closes every stream, since both APIs
    end theirs with it."""
    stream = given.get("stream", False)
    if not isinstance(stream, bool):
        raise refuse("stream", "stream must be a boolean")
    if stream:
        chat.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(chat, separators=(",", ":")).encode()


def tool_call_arguments(call: dict[str, Any]) -> tuple[str, str, str]:
    """(id, name, arguments) of a chat tool call, whatever of it is missing."""
    function = call.get("function") or {}
    return str(call.get("id") or ""), str(function.get("name") or ""), str(function.get("arguments") or "")


def usage_counts(usage: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a chat usage object; 0 for what it lacks."""
    if not isinstance(usage, dict):
        return 0, 0
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0), (completion if isinstance(completion, int) else 0)


def json_body(body: bytes) -> dict[str, Any]:
    # pydantic-core stops at its nesting limit with a ValueError; the chat body made from this one is then
    # checked as every chat body is (request.py).
    try:
        payload = pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as exc:
        raise GatewayError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, "request body must be a JSON object", code="invalid_json")
    return payload
