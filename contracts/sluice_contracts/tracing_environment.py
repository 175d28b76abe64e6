"""When the gateway and the runtime export traces, read from the standard OpenTelemetry environment.

Tracing is on when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` names an endpoint, and
neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` turns it off; with nothing set there is no
exporter and no SDK at all. The protocol is `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL`:
`http/protobuf` (the default) or `grpc`. Everything else (sampler, service name, resource, headers, batching)
is the SDK's own reading of its variables.
"""
from __future__ import annotations

from collections.abc import Mapping

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
