"""The demand signal of scale to zero: what the gateway reports per model and the operator reads.

Each gateway replica exposes these series on its metrics port (label BACKEND_LABEL: the InferenceModel, as the
routing table names its backends). The operator reads every replica's, so the signal and the idle clock cover
all of them: requests held anywhere start a replica, and a model is idle only when no replica has one held, none
in flight and none answered since the operator last looked.
"""
from __future__ import annotations

BACKEND_LABEL = "backend"

# Gauge: requests held now because the model has no endpoint (scaled to zero, or starting).
HELD_REQUESTS = "sluice_gateway_held_requests"
# Gauge: requests forwarded to one of the model's endpoints and not yet answered in full.
BACKEND_IN_FLIGHT = "sluice_gateway_backend_requests_in_flight"
# Counter family (exposed as NAME_total), also labelled route, tenant and status: requests answered.
REQUESTS = "sluice_gateway_requests"
