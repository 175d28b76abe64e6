"""The runtime's tracer, set up from the standard OpenTelemetry environment (sluice_contracts.tracing_environment):
None when tracing is not configured, so no SDK is loaded and a request pays one `is None` check.

The provider is the runtime's own, never the process-global one; its batch processor exports from the SDK's worker
thread, never from the engine loop. Spans carry no prompt or completion text.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from sluice_contracts.tracing_environment import otlp_protocol

SERVICE_NAME = "sluice-runtime"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names another


class RuntimeTracing:
    """A tracer, and the trace id the next root span is to take: a request with no caller's trace is named by
    an id of the runtime's own from its arrival (its header and log line), before any span of it exists."""

    def __init__(self, protocol: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracing = self

        class _Ids(RandomIdGenerator):
            def generate_trace_id(self) -> int:
                pending, tracing.pending_trace_id = tracing.pending_trace_id, None
                return pending if pending is not None else super().generate_trace_id()

        self.pending_trace_id: int | None = None
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        # The sampler is OTEL_TRACES_SAMPLER's, read by the SDK (by default: the caller's sampled flag).
        self._provider = TracerProvider(resource=resource, id_generator=_Ids())
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self._provider.get_tracer("sluice_runtime")

    def shutdown(self) -> None:
        """Flush what is batched, then stop the exporter."""
        self._provider.shutdown()


def tracing_from_environment(environ: Mapping[str, str] = os.environ) -> RuntimeTracing | None:
    """Raises TracingSettingsError for an OTEL_* value it cannot use."""
    protocol = otlp_protocol(environ)
    return RuntimeTracing(protocol) if protocol is not None else None
