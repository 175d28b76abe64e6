"""kopf's peering object, the operator replicas' leader election.

The chart renders it so that `helm uninstall` removes it, and the operator creates it where it is
missing (run outside the chart). Under the chart both happened at install, and an operator that
started first made helm's create fail with "already exists": an operator of a helm release now
waits for the release's object (runner), and one it creates after all carries the release's helm
ownership metadata, so the next `helm upgrade` adopts it.
"""
from __future__ import annotations

from typing import Any

from ..crd.definitions import PEERING_GROUP


def build_peering(name: str, namespace: str | None, helm_release: tuple[str, str] | None) -> dict[str, Any]:
    """A KopfPeering in `namespace`, or a ClusterKopfPeering without one; `helm_release`: (name,
    namespace) of the helm release that renders the same object."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if helm_release is not None:
        release, release_namespace = helm_release
        metadata["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
        metadata["annotations"] = {"meta.helm.sh/release-name": release,
                                   "meta.helm.sh/release-namespace": release_namespace}
    return {"apiVersion": f"{PEERING_GROUP}/v1", "kind": "KopfPeering" if namespace else "ClusterKopfPeering",
            "metadata": metadata}
