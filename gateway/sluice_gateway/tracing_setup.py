"""The gateway's tracer, set up from the standard OpenTelemetry environment (sluice_contracts.tracing_environment):
None when tracing is not configured, so no SDK is loaded and each request pays one `is None` check.

The provider is the gateway's own, never the process-global one, and its batch processor exports off the event
loop (the SDK's worker thread). Spans carry no prompt or completion text.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sluice_contracts.tracing_environment import otlp_protocol

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

SERVICE_NAME = "sluice-gateway"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names another


def tracing_from_environment(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """The provider whose tracer makes the gateway's spans (its shutdown flushes them), or None when tracing is
    not configured; raises TracingSettingsError for an OTEL_* value it cannot use."""
    protocol = otlp_protocol(environ)
    if protocol is None:
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER, read by the SDK
    provider.add_span_processor(BatchSpanProcessor(GrpcExporter() if protocol == "grpc" else HttpExporter()))
    return provider
