"""A request's spans, built once it has ended from the timestamps the server and the engine already keep, so the
engine loop does no tracing work: the server span under the caller's (a gateway's upstream attempt), and under
it the engine's queue, prefill and decode, then the stream to the client (from its headers to its last chunk:
past decode's end by as long as the client was not reading).

Attribute names are the OpenTelemetry GenAI and HTTP conventions where they name one; Sluice's own are under
sluice.*. No prompt or completion text.
"""
from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import SpanKind

from sluice_contracts.trace_context import TraceContext, new_span_id
from sluice_contracts.tracing_environment import SpanRecord, Tracing

from .request_log import RequestRecord

_OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion", "/v1/embeddings": "embeddings",
               "/v1/rerank": "rerank"}


@dataclass(slots=True)
class ResponseTimes:
    """Wall-clock nanoseconds of the response's headers and its last body chunk, and how many chunks it took."""

    started_ns: int | None = None
    last_ns: int | None = None
    chunks: int = 0


def emit(tracing: Tracing, record: RequestRecord, caller: TraceContext | None, arrived_ns: int,
         ended_ns: int, response: ResponseTimes) -> None:
    name = f"{record.method} {record.path}"
    if not tracing.sampled(caller, record.trace_id, name):
        return
    trace_id, server_id = record.trace_id, new_span_id()

    def under(span_name: str, start: float | int, end: float | int, attributes: dict | None = None) -> SpanRecord:
        return SpanRecord(span_name, SpanKind.INTERNAL, trace_id, new_span_id(), server_id, _ns(start), _ns(end),
                          attributes or {})

    spans = [SpanRecord(name, SpanKind.SERVER, trace_id, server_id, caller.parent_id if caller else None,
                        arrived_ns, ended_ns, _server_attributes(record), remote_parent=True)]
    m = record.engine_metrics
    if m is not None and m.first_scheduled_time is not None:
        spans.append(under("queue", m.arrival_time, m.first_scheduled_time))
        if m.first_token_time is not None:
            spans.append(under("prefill", m.first_scheduled_time, m.first_token_time, {
                "sluice.prefill.tokens": record.prompt_tokens or 0, "sluice.prefill.chunks": m.num_prefill_chunks,
                "gen_ai.usage.cache_read.input_tokens": m.num_cached_prompt_tokens}))
            if m.finished_time is not None:
                spans.append(under("decode", m.first_token_time, m.finished_time, {
                    "sluice.decode.tokens": record.completion_tokens or 0,
                    "sluice.decode.preemptions": m.num_preemptions}))
    if record.stream and response.started_ns is not None:
        spans.append(SpanRecord("stream", SpanKind.INTERNAL, trace_id, new_span_id(), server_id, response.started_ns,
                                response.last_ns or response.started_ns, {"sluice.stream.chunks": response.chunks}))
    tracing.export(spans)


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


def _ns(at: float | int) -> int:
    """Nanoseconds since the epoch, from the engine's seconds (time.time()) or nanoseconds already."""
    return at if isinstance(at, int) else int(at * 1e9)
