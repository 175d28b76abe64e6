"""What one Sluice release shares across the namespaces its operator serves: the runtime credential.

The credential's source Secret lives in the release's namespace (the chart renders it empty, the operator
fills it once); every other namespace holding InferenceModels gets a copy owned by those models, so it goes
with the last of them.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from sluice_contracts import runtime_credential

from ..crd import MANAGED_BY
from .names import model_owner_references

LABEL_RELEASE = "sluice.dev/release"


@dataclass(frozen=True)
class Release:
    name: str  # the prefix of what the release's operator creates (the chart's fullname)
    namespace: str  # where the operator and the gateway run

    @property
    def credential_secret(self) -> str:
        return runtime_credential.secret_name(self.name)


def release_labels(release: Release) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/part-of": "sluice",
            LABEL_RELEASE: release.name}


def read_credential(secret: dict[str, Any] | None) -> str | None:
    """The credential a Secret holds, or None when it holds none (missing, empty, not text)."""
    encoded = ((secret or {}).get("data") or {}).get(runtime_credential.SECRET_KEY)
    try:
        value = base64.b64decode(encoded or "").decode("ascii").strip()
    except (ValueError, UnicodeDecodeError):
        return None
    return value or None


def _data(credential: str) -> dict[str, str]:
    return {runtime_credential.SECRET_KEY: base64.b64encode(credential.encode()).decode()}


def build_credential_source(release: Release, credential: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": release.credential_secret, "namespace": release.namespace,
                     "labels": release_labels(release)},
        "type": "Opaque",
        "data": _data(credential),
    }


def build_credential_copy(release: Release, namespace: str, credential: str,
                          models: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": release.credential_secret, "namespace": namespace, "labels": release_labels(release),
                     "ownerReferences": model_owner_references(models)},
        "type": "Opaque",
        "data": _data(credential),
    }
