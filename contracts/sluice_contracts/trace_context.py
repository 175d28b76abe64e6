"""W3C Trace Context as the gateway and the runtime read, start and pass it on, and the response header that names
a request's trace.

A request's `traceparent` is kept when it is valid by the W3C Trace Context grammar (version 00, or a later one
read as 00: lowercase hex, neither id all zeros, version ff refused, one header only); anything else is dropped
and a new trace is started, never an error: a client's malformed header costs it nothing but its trace.
`tracestate` travels with a kept `traceparent` only, unchanged when its members are valid and at most
`MAX_STATE_MEMBERS`; otherwise it is dropped whole. Each hop sends on the same trace id with a span id of its
own as the parent (a retry's attempts: one each, siblings), and the sampled flag as it came (no other flag).

vLLM and SGLang read the same two headers, so a trace reaches them as it reaches Sluice's runtime.
"""
from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# Every answer of the gateway (and of the runtime, called directly) names its trace here: the id to search for.
TRACE_ID_HEADER = "x-sluice-trace-id"

MAX_STATE_MEMBERS = 32  # the W3C bound: past it a tracestate may be dropped whole
MAX_STATE_CHARS = 512  # what every hop must pass on, at least; a longer tracestate is dropped whole

_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.ASCII | re.DOTALL)
_KEY = r"(?:[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(f"({_KEY})=({_VALUE})", re.ASCII)
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_SAMPLED = 0x01


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str  # 32 lowercase hex digits
    parent_id: str  # 16 lowercase hex digits: the span of the hop that sent the request
    sampled: bool = False
    state: str | None = None  # the tracestate passed on with it

    def child(self) -> "TraceContext":
        """The context a hop sends on: the same trace, the hop's own new span as the parent."""
        return TraceContext(self.trace_id, new_span_id(), self.sampled, self.state)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{'01' if self.sampled else '00'}"

    def headers(self) -> dict[str, str]:
        """Its headers for a request going on to the next hop."""
        headers = {TRACEPARENT: self.traceparent}
        if self.state:
            headers[TRACESTATE] = self.state
        return headers


def new_trace() -> TraceContext:
    """A trace started here, with nothing recorded upstream of it (not sampled: no exporter asked for it)."""
    trace_id = _random_hex(128)
    while trace_id == _ZERO_TRACE:
        trace_id = _random_hex(128)
    return TraceContext(trace_id, new_span_id())


def new_span_id() -> str:
    span_id = _random_hex(64)
    while span_id == _ZERO_SPAN:
        span_id = _random_hex(64)
    return span_id


def read(traceparents: Iterable[str], tracestates: Iterable[str] = ()) -> TraceContext | None:
    """The context a request carries in the values of its `traceparent` and `tracestate` headers (each as often
    as it was sent), or None when it carries no valid one."""
    parents = list(traceparents)
    if len(parents) != 1:
        return None
    match = _PARENT.fullmatch(parents[0])
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None) or trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceContext(trace_id, parent_id, bool(int(flags, 16) & _SAMPLED), _state(list(tracestates)))


def read_or_start(traceparents: Iterable[str], tracestates: Iterable[str] = ()) -> TraceContext:
    return read(traceparents, tracestates) or new_trace()


def _state(values: list[str]) -> str | None:
    """The tracestate to pass on, or None: several headers are one list, joined in order."""
    joined = ",".join(values)
    if not joined or len(joined) > MAX_STATE_CHARS:
        return None
    members = [member.strip(" \t") for member in joined.split(",")]
    members = [member for member in members if member]
    if not members or len(members) > MAX_STATE_MEMBERS:
        return None
    keys = set()
    for member in members:
        match = _MEMBER.fullmatch(member)
        if match is None or match.group(1) in keys:
            return None
        keys.add(match.group(1))
    return ",".join(members)


def _random_hex(bits: int) -> str:
    # The module's generator: seeded from the OS and reseeded in a forked child, and no system call per id.
    return f"{random.getrandbits(bits):0{bits // 4}x}"
