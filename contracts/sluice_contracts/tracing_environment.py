"""When and how the gateway and the runtime export traces, read from the standard OpenTelemetry environment.

Tracing is on when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` names an endpoint, and
neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` turns it off; with nothing set there is no
exporter and no tracing SDK. The protocol is `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL`:
`http/protobuf` (the default) or `grpc`. Everything else (sampler, service name, resource, headers, batching)
is the SDK's own reading of its variables.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The API only (no SDK): what a span context is, which every OpenTelemetry package shares.
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState, set_span_in_context

from .trace_context import TraceContext

_SAMPLED, _UNSAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)

PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_PROTOCOL = "http/protobuf"


class TracingSettingsError(ValueError):
    """An OTEL_* variable with a value neither component can use."""


def otlp_protocol(environ: Mapping[str, str]) -> str | None:
    """The OTLP protocol to export spans with, or None when tracing is not configured."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        return None
    if exporter != "otlp":
        raise TracingSettingsError(f"OTEL_TRACES_EXPORTER must be otlp or none, got {exporter!r}")
    if not (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if value := environ.get(name, "").strip():
            if value not in PROTOCOLS:
                raise TracingSettingsError(f"{name} must be one of {', '.join(PROTOCOLS)}, got {value!r}")
            return value
    return DEFAULT_PROTOCOL


class Tracing:
    """A component's own tracer provider (never the process-global one), whose sampler (OTEL_TRACES_SAMPLER, read
    by the SDK) decides each trace, and whose batch processor exports from a worker thread of its own.

    Both components mark a request's steps as it runs and turn the marks into spans once it has been answered
    (`export`): finished spans with the ids and times they already have (the trace id in the answer's header, the
    span id an upstream attempt was sent as its parent), handed straight to the batch processor, so no tracer
    runs on the request's path.
    """

    def __init__(self, protocol: str, service_name: str, scope: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        exporter: SpanExporter
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
            exporter = Grpc()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
            exporter = Http()
        resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read by the SDK
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": service_name}))
        self._provider = TracerProvider(resource=resource)
        self._processor = BatchSpanProcessor(exporter)
        self._provider.add_span_processor(self._processor)
        self._span = ReadableSpan
        self._scope = InstrumentationScope(scope)
        self.sampler = self._provider.sampler

    def sampled(self, caller: TraceContext | None, trace_id: str, name: str) -> bool:
        """The sampler's decision for a request's trace: `caller` is the trace it came with (None: started here)."""
        parent = None
        if caller is not None:
            flags = _SAMPLED if caller.sampled else _UNSAMPLED
            state = TraceState.from_header([caller.state]) if caller.state else None
            parent = set_span_in_context(NonRecordingSpan(SpanContext(
                int(caller.trace_id, 16), int(caller.parent_id, 16), True, flags, state)))
        return self.sampler.should_sample(parent, int(trace_id, 16), name, SpanKind.SERVER).decision.is_sampled()

    def export(self, spans: list[SpanRecord]) -> None:
        """Finished spans of one sampled trace, to be exported."""
        resource, scope, on_end = self._provider.resource, self._scope, self._processor.on_end
        for span in spans:
            trace_id = int(span.trace_id, 16)
            context = SpanContext(trace_id, int(span.span_id, 16), False, _SAMPLED)
            parent = (SpanContext(trace_id, int(span.parent_id, 16), span.remote_parent, _SAMPLED)
                      if span.parent_id else None)
            on_end(self._span(name=span.name, context=context, parent=parent, resource=resource,
                              attributes=span.attributes, kind=span.kind, start_time=span.start_ns,
                              end_time=span.end_ns, instrumentation_scope=scope))

    def shutdown(self) -> None:
        """Flush what is batched, then stop the exporter."""
        self._provider.shutdown()


@dataclass(slots=True)
class SpanRecord:
    """One finished span as a component marked it: ids as lowercase hex, times in nanoseconds since the epoch."""

    name: str
    kind: SpanKind
    trace_id: str
    span_id: str
    parent_id: str | None  # None: the trace's root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    remote_parent: bool = False  # the parent is another process's span (the caller's)


def tracing_from_environment(environ: Mapping[str, str], service_name: str, scope: str) -> Tracing | None:
    """The component's tracing, or None when the environment configures none (then nothing of the tracing SDK is loaded);
    raises TracingSettingsError for an OTEL_* value it cannot use."""
    protocol = otlp_protocol(environ)
    return Tracing(protocol, service_name, scope) if protocol is not None else None
