"""Custom resource models (the source of truth) and the CRDs generated from them."""
from .base import API_VERSION, GROUP, LABEL_MODEL, MANAGED_BY, RUNTIME_PORT, VERSION
from .inference_model import (
                              ENGINE_IMAGES,
                              SLUICE_DTYPE,
                              SLUICE_KV_CACHE_MEMORY,
                              InferenceModel,
                              InferenceModelSpec,
                              InferenceModelStatus,
)
from .model_route import ModelRoute, ModelRouteSpec, ModelRouteStatus
from .status import Condition

KINDS = (InferenceModel, ModelRoute)

__all__ = [
    "ENGINE_IMAGES", "SLUICE_DTYPE", "SLUICE_KV_CACHE_MEMORY", "API_VERSION", "GROUP", "LABEL_MODEL", "MANAGED_BY", "RUNTIME_PORT", "VERSION", "KINDS", "Condition",
    "InferenceModel", "InferenceModelSpec", "InferenceModelStatus",
    "ModelRoute", "ModelRouteSpec", "ModelRouteStatus",
]
