"""Names, labels and owner references every object built for an InferenceModel carries."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..crd import API_VERSION, LABEL_MODEL, MANAGED_BY, InferenceModel


@dataclass(frozen=True)
class Owner:
    """The InferenceModel the built objects belong to; deleting it garbage-collects them."""

    name: str
    namespace: str
    uid: str
    generation: int = 0

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": InferenceModel.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "labels": labels(self.name),
            "ownerReferences": [self.reference()],
        }


RUNTIME_APP = "sluice-runtime"
PART_OF = "sluice"
# The generation an object was built from: the model's on its Deployment, the table's on the routing table.
GENERATION_ANNOTATION = "sluice.dev/generation"


def managed_labels() -> dict[str, str]:
    """What every object the operator makes carries."""
    return {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/part-of": PART_OF}


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": RUNTIME_APP, LABEL_MODEL: name}


def runtime_pod_labels() -> dict[str, str]:
    """What every runtime pod carries, whatever its model: what the release's NetworkPolicy selects."""
    return {"app.kubernetes.io/name": RUNTIME_APP, "app.kubernetes.io/managed-by": MANAGED_BY}


def labels(name: str) -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/instance": name,
        **managed_labels(),
    }


def selector_string(name: str) -> str:
    """The same selector as `kubectl get pods -l`, for the scale subresource."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def model_owner_references(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every InferenceModel of a namespace as an owner of an object they share: it goes with the last of them,
    should the operator be away then."""
    return [{"apiVersion": API_VERSION, "kind": InferenceModel.kind, "name": m["metadata"]["name"],
             "uid": m["metadata"]["uid"]} for m in models]
