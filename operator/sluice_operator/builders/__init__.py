"""Pure functions: an InferenceModel spec in, Kubernetes manifests out."""
from collections.abc import Mapping
from typing import Any

from ..crd import InferenceModelSpec
from .deployment import NoGuardImage, build_deployment, build_deployment_for
from .disruption_budget import build_disruption_budget
from .model_policy import ModelPolicy, image_allowed, image_refusal, token_secret_refusal
from .names import (
    GENERATION_ANNOTATION,
    LABEL_MODEL,
    Owner,
    labels,
    managed_labels,
    model_owner_references,
    selector_labels,
    selector_string,
)
from .ownership import conflict_message, controlled_by, foreign
from .release import (
    NetworkPeers,
    Release,
    build_credential_copy,
    build_credential_source,
    build_runtime_network_policy,
    read_credential,
)
from .routing_table import ROUTING_TABLE, ROUTING_TABLE_KEY, build_routing_table
from .service import build_service
from .status import Observed, model_status


def build_all(owner: Owner, spec: InferenceModelSpec, release: Release | None = None,
              images: Mapping[str, str] | None = None,
              deployment: dict[str, Any] | None = None, guard_image: str | None = None) -> list[dict[str, Any]]:
    """Every object an InferenceModel owns, in the order they are applied; `deployment`: the one that exists."""
    credential = release.credential_secret if release is not None else None
    return [build_service(owner), build_disruption_budget(owner),
            build_deployment_for(owner, spec, credential, deployment, images, guard_image)]


__all__ = [
    "GENERATION_ANNOTATION", "LABEL_MODEL", "ModelPolicy", "NetworkPeers", "NoGuardImage", "image_allowed",
    "image_refusal", "token_secret_refusal", "Observed", "Owner", "ROUTING_TABLE", "ROUTING_TABLE_KEY",
    "Release", "model_status", "build_all", "build_credential_copy", "build_credential_source", "build_deployment",
    "build_deployment_for", "build_disruption_budget", "build_routing_table", "build_runtime_network_policy", "conflict_message",
    "controlled_by", "foreign", "build_service", "labels", "managed_labels", "model_owner_references",
    "read_credential", "selector_labels", "selector_string",
]
