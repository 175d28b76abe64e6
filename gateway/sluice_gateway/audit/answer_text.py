"""The text of a chat or completions answer as its client was sent it, for the prompt capture: each choice's
`content` (chat) or `text` (completions), read from the whole body once it is out, or put together from a
stream's events after each has gone on to the client. Bounded: past `limit` characters, or a body past
`MAX_BODY_BYTES`, the rest is not read, and `cut` says so."""
from __future__ import annotations

import json
from typing import Any

# A non-streamed answer is read whole, after it was sent; one larger than this (logprobs of many tokens) is not.
MAX_BODY_BYTES = 1 << 20
# Bytes of a stream held while an event is incomplete; the relay sends whole events, so this is never reached.
_MAX_PENDING = 64 * 1024


class AnswerText:
    def __init__(self, stream: bool, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._chars = 0
        self._choices: dict[int, list[str]] = {}
        self._body: list[bytes] = []  # of a non-streamed answer: the chunks it was sent in, not copied
        self._size = 0
        self._pending = b""
        self._status = 0
        self.cut = False

    def saw(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._status = message["status"]
            return
        body = message.get("body", b"")
        if not body or self._status != 200 or self.cut:
            return
        if not self._stream:
            self._size += len(body)
            if self._size > MAX_BODY_BYTES:
                self.cut, self._body = True, []
            else:
                self._body.append(body)
            return
        events = self._pending + body
        end = events.rfind(b"\n\n")
        if end < 0:
            self._pending = events if len(events) <= _MAX_PENDING else b""
            return
        self._pending = events[end + 2:]
        for event in events[:end].split(b"\n\n"):
            for line in event.split(b"\n"):
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    self._add(_json(line[5:]))

    def texts(self) -> list[str] | None:
        """Each choice's text, in the order of their indexes; None for an answer that was no success."""
        if self._body:
            self._add(_json(b"".join(self._body)))
            self._body = []
        if self._status != 200:
            return None
        return ["".join(self._choices[index]) for index in sorted(self._choices)]

    def _add(self, document: Any) -> None:
        choices = document.get("choices") if isinstance(document, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or not isinstance(index := choice.get("index", 0), int):
                continue
            part = choice.get("delta") if self._stream else choice.get("message")
            text = part.get("content") if isinstance(part, dict) else choice.get("text")
            pieces = self._choices.setdefault(index, [])
            if not isinstance(text, str) or not text:
                continue
            if self._chars + len(text) > self._limit:
                text, self.cut = text[:self._limit - self._chars], True
            pieces.append(text)
            self._chars += len(text)
            if self.cut:
                return


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None
