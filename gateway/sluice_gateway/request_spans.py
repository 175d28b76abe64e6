"""The spans of one proxied request: a server span under the client's trace (or a trace started here), and one
span per step under it (auth, route, limits, each hold, each upstream attempt).

Each step is marked beside the code it measures: `step()` notes its name and start, its `end()` the end, with
plain values for attributes; nothing of the SDK runs until the request has been answered, when `finish()` hands
every span, with those times, to the exporter (sluice_contracts.tracing_environment). Every span's id is drawn
when its step starts; an upstream attempt's is the parent its upstream is sent in `traceparent`, so the
runtime's spans sit under the attempt that reached it. Whether a trace is sampled is decided once, when the
request arrives.

Without tracing, or for a trace the sampler drops, every step is NO_STEP: a method call that returns a constant,
no clock, no ids. Attributes are set only on steps that record (`is_recording()`).
"""
from __future__ import annotations

import time
from typing import Any

from opentelemetry.trace import SpanKind

from sluice_contracts.trace_context import TraceContext, new_span_id, new_trace
from sluice_contracts.tracing_environment import SpanRecord, Tracing

# Names of the OpenTelemetry semantic conventions (GenAI and HTTP) where one exists; Sluice's own under sluice.*.
OPERATIONS = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings", "rerank": "rerank"}


class Step:
    """One step's mark: its name and kind, its span id, when it started and ended, its attributes."""

    __slots__ = ("name", "kind", "span_id", "start_ns", "end_ns", "attributes")

    def __init__(self, name: str, kind: SpanKind) -> None:
        self.name, self.kind, self.span_id, self.start_ns = name, kind, new_span_id(), time.time_ns()
        self.end_ns: int | None = None
        self.attributes: dict[str, Any] = {}

    def is_recording(self) -> bool:
        return True

    def set_attribute(self, name: str, value: Any) -> None:
        self.attributes[name] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def end(self) -> None:
        if self.end_ns is None:
            self.end_ns = time.time_ns()

    def __enter__(self) -> Step:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


class _NoStep:
    __slots__ = ()

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, name: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        pass

    def end(self) -> None:
        pass

    def __enter__(self) -> _NoStep:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


NO_STEP = _NoStep()


class RequestSpans:
    __slots__ = ("trace", "root", "_tracing", "_client", "_steps")

    def __init__(self, tracing: Tracing, client: TraceContext | None, name: str) -> None:
        self._tracing, self._client = tracing, client
        trace_id = client.trace_id if client is not None else new_trace().trace_id
        sampled = tracing.sampled(client, trace_id, name)
        self.root: Step | _NoStep = Step(name, SpanKind.SERVER) if sampled else NO_STEP
        # The request's trace from here on: the client's id (or one started here) under the gateway's span.
        self.trace = TraceContext(trace_id, self.root.span_id if isinstance(self.root, Step) else new_span_id(),
                                  sampled, client.state if client is not None else None)
        self._steps: list[Step] = []

    def step(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> Step | _NoStep:
        """A step under the request's span, started now; ended by the caller (or its `with` block)."""
        if self.root is NO_STEP:
            return NO_STEP
        step = Step(name, kind)
        self._steps.append(step)
        return step

    def upstream(self, attempt: Step | _NoStep, trace: TraceContext) -> TraceContext:
        """The context an upstream attempt sends on: the attempt's span as the parent."""
        if isinstance(attempt, Step):
            return TraceContext(trace.trace_id, attempt.span_id, trace.sampled, trace.state)
        return trace.child()

    def finish(self) -> None:
        """The request's spans, to the exporter (once it has been answered)."""
        root = self.root
        if not isinstance(root, Step):
            return
        root.end()
        trace_id, end_ns, client = self.trace.trace_id, root.end_ns or 0, self._client
        spans = [SpanRecord(root.name, root.kind, trace_id, root.span_id, client.parent_id if client else None,
                            root.start_ns, end_ns, root.attributes, remote_parent=True)]
        spans.extend(SpanRecord(step.name, step.kind, trace_id, step.span_id, root.span_id, step.start_ns,
                                step.end_ns or end_ns, step.attributes) for step in self._steps)
        self._tracing.export(spans)


class _NoSpans:
    """Tracing off: every step is NO_STEP, and upstream gets a fresh span id as its parent
    (sluice_contracts.trace_context)."""

    __slots__ = ()
    root = NO_STEP

    def step(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> _NoStep:
        return NO_STEP

    def upstream(self, attempt: Step | _NoStep, trace: TraceContext) -> TraceContext:
        return trace.child()

    def finish(self) -> None:
        pass


NO_SPANS = _NoSpans()
