"""The answering backend's model version stamped on its answer (sluice_contracts.model_version): the routing table
names it, so a chat or completion body and each of its stream chunks carry its fingerprint as system_fingerprint,
whatever the engine put there (vLLM and SGLang know nothing of the InferenceModel).

Bodies are not parsed: inside a JSON string every quote is escaped, so an unescaped `"system_fingerprint":` is the
key itself, which OpenAI bodies hold once, at the top level.
"""
from __future__ import annotations

import json
import re

_KEY = re.compile(rb'"system_fingerprint"\s*:\s*(?:null|"(?:[^"\\]|\\.)*")')
_OPENING = re.compile(rb"\{\s*")


def field(fingerprint: str) -> bytes:
    return b'"system_fingerprint":' + json.dumps(fingerprint).encode()


def stamp_body(body: bytes, stamp: bytes) -> bytes:
    """A whole JSON object's system_fingerprint replaced by `stamp` (a `field`), or added as its first member."""
    stamped, found = _KEY.subn(lambda _: stamp, body, count=1)
    if found:
        return stamped
    opening = _OPENING.match(body)
    if opening is None:
        return body
    rest = body[opening.end():]
    return b"{" + stamp + (b"" if rest.startswith(b"}") else b",") + rest


def stamp_events(events: bytes, stamp: bytes) -> bytes:
    """Whole SSE events: each chunk's (a data event with choices; not an error, not [DONE]) stamped."""
    if b'"choices"' not in events:
        return events
    out = []
    for event in events.split(b"\n\n"):
        if event.startswith(b"data:") and b'"choices"' in event:
            data = event[5:].lstrip(b" ")
            event = b"data: " + stamp_body(data, stamp)
        out.append(event)
    return b"\n\n".join(out)
