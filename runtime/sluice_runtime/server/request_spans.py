"""A request's spans, built once it has ended from the timestamps the server and the engine already keep, so the
engine loop does no tracing work: the server span under the caller's (a gateway's upstream attempt), and under
it the engine's queue, prefill and decode, then the stream to the client (from its headers to its last chunk:
past decode's end by as long as the client was not reading).

Attribute names are the OpenTelemetry GenAI and HTTP conventions where they name one; Sluice's own are under
sluice.*. No prompt or completion text.
"""
from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState, set_span_in_context

from sluice_contracts.trace_context import TraceContext

from .request_log import RequestRecord
from .tracing_setup import RuntimeTracing

_OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion", "/v1/embeddings": "embeddings",
               "/v1/rerank": "rerank"}


@dataclass(slots=True)
class ResponseTimes:
    """Wall-clock nanoseconds of the response's headers and its last body chunk, and how many chunks it took."""

    started_ns: int | None = None
    last_ns: int | None = None
    chunks: int = 0


def emit(tracing: RuntimeTracing, record: RequestRecord, caller: TraceContext | None, arrived_ns: int,
         ended_ns: int, response: ResponseTimes) -> None:
    parent = None
    if caller is not None:
        state = TraceState.from_header([caller.state]) if caller.state else None
        flags = TraceFlags(TraceFlags.SAMPLED if caller.sampled else TraceFlags.DEFAULT)
        parent = set_span_in_context(NonRecordingSpan(SpanContext(
            int(caller.trace_id, 16), int(caller.parent_id, 16), is_remote=True, trace_flags=flags,
            trace_state=state)))
    else:
        tracing.pending_trace_id = int(record.trace_id, 16)
    tracer = tracing.tracer
    root = tracer.start_span(f"{record.method} {record.path}", parent, kind=SpanKind.SERVER, start_time=arrived_ns)
    if not root.is_recording():
        return
    root.set_attributes(_server_attributes(record))
    under = set_span_in_context(root)
    m = record.engine_metrics
    if m is not None and m.first_scheduled_time is not None:
        tracer.start_span("queue", under, start_time=_ns(m.arrival_time)).end(_ns(m.first_scheduled_time))
        if m.first_token_time is not None:
            prefill = tracer.start_span("prefill", under, start_time=_ns(m.first_scheduled_time), attributes={
                "sluice.prefill.tokens": record.prompt_tokens or 0,
                "gen_ai.usage.cache_read.input_tokens": m.num_cached_prompt_tokens})
            prefill.end(_ns(m.first_token_time))
            if m.finished_time is not None:
                decode = tracer.start_span("decode", under, start_time=_ns(m.first_token_time), attributes={
                    "sluice.decode.tokens": record.completion_tokens or 0,
                    "sluice.decode.preemptions": m.num_preemptions})
                decode.end(_ns(m.finished_time))
    if record.stream and response.started_ns is not None:
        stream = tracer.start_span("stream", under, start_time=response.started_ns,
                                   attributes={"sluice.stream.chunks": response.chunks})
        stream.end(response.last_ns or response.started_ns)
    root.end(ended_ns)


def _server_attributes(record: RequestRecord) -> dict:
    attributes: dict = {"http.request.method": record.method, "url.path": record.path,
                        "sluice.request_id": record.request_id, "sluice.cancelled": record.cancelled}
    if operation := _OPERATIONS.get(record.path):
        attributes["gen_ai.operation.name"] = operation
    for name, value in (("http.response.status_code", record.status), ("gen_ai.request.model", record.model),
                        ("gen_ai.usage.input_tokens", record.prompt_tokens),
                        ("gen_ai.usage.output_tokens", record.completion_tokens),
                        ("sluice.priority", record.priority), ("error.type", record.error_code)):
        if value is not None:
            attributes[name] = value
    if record.finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = list(record.finish_reasons)
    return attributes


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
