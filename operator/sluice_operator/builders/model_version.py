"""An InferenceModel's model version (sluice_contracts.model_version): its weights for the runtime's
--model-version, and with its generation for the routing table's backends."""
from __future__ import annotations

from sluice_contracts.model_version import model_version, weights_version

from ..crd import InferenceModelSpec


def weights(spec: InferenceModelSpec) -> str:
    return weights_version(spec.model.source, spec.model.revision)


def backend_version(spec: InferenceModelSpec, generation: int) -> str:
    """The version the routing table gives the model's backends (and so every answer through the gateway)."""
    return model_version(weights(spec), generation)
