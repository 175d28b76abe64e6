"""InferenceModel → the Service whose EndpointSlices list its ready pods."""
from __future__ import annotations

from typing import Any

from ..crd import RUNTIME_PORT
from .names import Owner, selector_labels


def build_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name),
            "ports": [{"name": "http", "port": RUNTIME_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
