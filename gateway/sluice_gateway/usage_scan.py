"""Usage and finish reason found in upstream bodies and stream events without parsing them whole (a body may be
megabytes of logprobs); the usage event the gateway asked for on the client's behalf is dropped on the way."""
from __future__ import annotations

import json
import re
from typing import Any

from .admission import is_count
from .request_context import Outcome

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_USAGE_WINDOW = 4096  # bytes from the start of the usage object that hold all of it
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]+)"')


def read_usage(data: bytes, outcome: Outcome) -> None:
    """Usage and the first choice's finish reason of a whole response body.

    Inside JSON strings quotes are escaped, so an unescaped `"usage": {` is a key; OpenAI bodies have one,
    at the top level. Only the object after it is decoded.
    """
    _note_finish(data, outcome)
    at = len(data)
    while (at := data.rfind(b'"usage"', 0, at)) >= 0:
        key = _USAGE.match(data, at)
        if key is None:
            continue
        window = data[key.end() - 1 : key.end() - 1 + _USAGE_WINDOW].decode("utf-8", errors="replace")
        try:
            usage, _ = json.JSONDecoder().raw_decode(window)
        except ValueError:
            return
        _take_usage(usage, outcome)
        return


def inspect_events(events: bytes, strip_usage: bool, outcome: Outcome) -> bytes:
    """Note finish reason and usage of whole SSE events; drop the usage-only event if `strip_usage`."""
    _note_finish(events, outcome)
    if not _USAGE.search(events):
        return events
    kept = []
    for event in events.split(b"\n\n"):
        if event and _USAGE.search(event) and event.startswith(b"data:"):
            try:
                parsed = json.loads(event[5:])
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                _take_usage(parsed.get("usage"), outcome)
            if strip_usage and _EMPTY_CHOICES.search(event):
                continue
        kept.append(event)
    return b"\n\n".join(kept)


def _note_finish(data: bytes, outcome: Outcome) -> None:
    finish = _FINISH.search(data)
    if finish:
        outcome.finish_reason = finish.group(1).decode()


def _take_usage(usage: Any, outcome: Outcome) -> None:
    """Counts only when both are plain non-negative integers: anything else leaves the reservation as it was."""
    if not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    if is_count(prompt) and is_count(completion):
        outcome.prompt_tokens, outcome.completion_tokens = prompt, completion
