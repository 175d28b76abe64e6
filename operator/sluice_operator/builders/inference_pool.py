"""InferenceModel → the Gateway API Inference Extension InferencePool of its runtime pods, and what the pool's
status says about it.

The pool (inference.networking.k8s.io/v1, GIE v1.x) selects the model's pods by the labels its Deployment
selects them by, on the runtime's port, and names an endpoint picker; a GIE gateway then routes to the pods
through that picker, which reads the vLLM metric names every engine here serves. Owned by the model, so it
goes with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..crd import RUNTIME_PORT, InferenceModelSpec
from ..crd.inference_model import EndpointPickerRef
from .names import Owner, selector_labels

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"
POOL_KIND = "InferencePool"
MSG_NO_PICKER = ("no endpoint picker to name in the InferencePool: set spec.inferencePool.endpointPicker or the "
                 "chart's inferencePool.endpointPicker.name")


@dataclass(frozen=True)
class PoolDefaults:
    """The chart's: whether models without spec.inferencePool get a pool, and the picker they name."""

    enabled: bool = False
    picker: EndpointPickerRef | None = None


def wanted_pool(spec: InferenceModelSpec, defaults: PoolDefaults) -> tuple[bool, EndpointPickerRef | None]:
    """Whether the model should have a pool, and the picker it names (None: none is configured)."""
    pool = spec.inference_pool
    if not (pool.enabled if pool is not None else defaults.enabled):
        return False, None
    return True, (pool.endpoint_picker if pool is not None else None) or defaults.picker


def pool_enabled(spec: dict[str, Any], defaults: PoolDefaults) -> bool:
    """From the raw spec (a kopf filter): an explicit spec.inferencePool.enabled, else the chart's default."""
    pool = spec.get("inferencePool")
    if isinstance(pool, dict):
        return pool.get("enabled", True) is not False
    return defaults.enabled


def build_inference_pool(owner: Owner, picker: EndpointPickerRef) -> dict[str, Any]:
    metadata = owner.metadata()
    return {
        "apiVersion": f"{POOL_GROUP}/{POOL_VERSION}",
        "kind": POOL_KIND,
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": selector_labels(owner.name)},
            "targetPorts": [{"number": RUNTIME_PORT}],
            "endpointPickerRef": {"group": "", "kind": "Service", "name": picker.name,
                                  "port": {"number": picker.port}, "failureMode": picker.failure_mode},
        },
    }


def pool_acceptance(pool: dict[str, Any] | None) -> tuple[str, str]:
    """(True | False | Unknown, why) from the Accepted conditions the pool's parents (gateways) wrote."""
    if pool is None:
        return "Unknown", "the InferencePool has not been created yet"
    verdicts = []
    for parent in ((pool.get("status") or {}).get("parents") or []):
        ref = parent.get("parentRef") or {}
        for condition in parent.get("conditions") or []:
            if condition.get("type") == "Accepted":
                verdicts.append((condition.get("status"), f"{ref.get('kind', 'Gateway')} {ref.get('name', '?')}: "
                                 f"{condition.get('reason', '')} {condition.get('message', '')}".strip()))
    if any(status == "True" for status, _ in verdicts):
        return "True", "; ".join(why for status, why in verdicts if status == "True")
    if verdicts:
        return "False", "; ".join(why for _, why in verdicts)
    return "Unknown", "no gateway references the InferencePool yet"
