"""Pure functions: an InferenceModel spec in, Kubernetes manifests out."""
from typing import Any

from ..crd import InferenceModelSpec
from .deployment import build_deployment
from .disruption_budget import build_disruption_budget
from .names import LABEL_MODEL, Owner, labels, selector_labels, selector_string
from .service import build_service
from .status import GENERATION_ANNOTATION, Observed, model_status


def build_all(owner: Owner, spec: InferenceModelSpec) -> list[dict[str, Any]]:
    """Every object an InferenceModel owns, in the order they are applied."""
    return [build_service(owner), build_disruption_budget(owner), build_deployment(owner, spec)]


__all__ = [
    "GENERATION_ANNOTATION", "LABEL_MODEL", "Observed", "Owner", "model_status", "build_all", "build_deployment", "build_disruption_budget",
    "build_service", "labels", "selector_labels", "selector_string",
]
