"""The runtime's tracing, set up from the standard OpenTelemetry environment (sluice_contracts.tracing_environment):
None when tracing is not configured, so nothing of the tracing SDK is loaded and a request pays one `is None`
check. The SDK's batch processor exports from a thread of its own, never from the engine loop.
"""
from __future__ import annotations

import os

from sluice_contracts.tracing_environment import Tracing
from sluice_contracts.tracing_environment import tracing_from_environment as from_environment

SERVICE_NAME = "sluice-runtime"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names another


def tracing_from_environment() -> Tracing | None:
    return from_environment(os.environ, SERVICE_NAME, "sluice_runtime")
