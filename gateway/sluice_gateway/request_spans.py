"""The spans of one proxied request: a server span under the client's trace (or a trace started here), and one
span per step under it (auth, route, limits, each hold, each upstream attempt), each started and ended beside
the step it measures.

Without tracing, every request shares NO_SPANS, whose steps are the API's non-recording span: a method call
that returns a constant, no ids, no clock. Attributes are set only on spans that record (`is_recording()`).
An upstream attempt's span id is the parent its upstream sees in `traceparent`, so the runtime's spans sit
under the attempt that reached it.
"""
from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
    TraceState,
    set_span_in_context,
)

from sluice_contracts.trace_context import TraceContext

# Names of the OpenTelemetry semantic conventions (GenAI and HTTP) where one exists; Sluice's own under sluice.*.
OPERATIONS = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings", "rerank": "rerank"}


class RequestSpans:
    __slots__ = ("root", "_tracer", "_context", "trace")

    def __init__(self, tracer: Tracer, client: TraceContext | None, name: str) -> None:
        self._tracer = tracer
        parent = None if client is None else set_span_in_context(NonRecordingSpan(_span_context(client)))
        self.root = tracer.start_span(name, parent, kind=SpanKind.SERVER)
        self._context: Context | None = set_span_in_context(self.root)
        ids = self.root.get_span_context()
        # The request's trace from here on: the client's id (or the one the SDK started), under the server span.
        self.trace = TraceContext(f"{ids.trace_id:032x}", f"{ids.span_id:016x}", ids.trace_flags.sampled,
                                  client.state if client is not None else None)

    def step(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> Span:
        """A span under the request's, started now; ended by the caller (or its `with` block)."""
        return self._tracer.start_span(name, self._context, kind=kind)

    def upstream(self, attempt: Span, trace: TraceContext) -> TraceContext:
        """The context an upstream attempt sends on: the attempt's span as the parent."""
        ids = attempt.get_span_context()
        return TraceContext(trace.trace_id, f"{ids.span_id:016x}", trace.sampled, trace.state)

    def end(self) -> None:
        self.root.end()


class _NoSpans:
    """Tracing off: every step is the shared non-recording span, and upstream gets a fresh span id as its
    parent (sluice_contracts.trace_context)."""

    __slots__ = ()
    root = INVALID_SPAN

    def step(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> Span:
        return INVALID_SPAN

    def upstream(self, attempt: Span, trace: TraceContext) -> TraceContext:
        return trace.child()

    def end(self) -> None:
        pass


NO_SPANS = _NoSpans()


def _span_context(trace: TraceContext) -> SpanContext:
    state = TraceState.from_header([trace.state]) if trace.state else None
    return SpanContext(int(trace.trace_id, 16), int(trace.parent_id, 16), is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED if trace.sampled else TraceFlags.DEFAULT),
                       trace_state=state)
