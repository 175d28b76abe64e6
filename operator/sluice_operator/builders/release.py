"""What one Sluice release keeps in the namespaces its operator serves: the runtime credential and the runtime
pods' NetworkPolicy.

The credential's source Secret lives in the release's namespace (the chart renders it empty, the operator
fills it once); every other namespace holding InferenceModels gets a copy, and every one of them a
NetworkPolicy, owned by its models, so they go with the last of them.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from sluice_contracts import runtime_credential

from ..crd import RUNTIME_PORT
from .names import managed_labels, model_owner_references, runtime_pod_labels

# The label the API server puts on every namespace: a namespace selector nobody can forge.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

LABEL_RELEASE = "sluice.dev/release"


@dataclass(frozen=True)
class NetworkPeers:
    """Who may open connections to runtime pods."""

    gateway: dict[str, str]  # labels of the gateway's pods, in the release namespace
    operator: dict[str, str]  # labels of the operator's pods there (it scrapes /metrics and /load)
    monitoring: dict[str, str] | None = None  # labels of the namespaces Prometheus scrapes from
    # labels of the scraper's pods there; None: any pod of those namespaces
    monitoring_pods: dict[str, str] | None = None


@dataclass(frozen=True)
class Release:
    name: str  # the prefix of what the release's operator creates (the chart's fullname)
    namespace: str  # where the operator and the gateway run
    peers: NetworkPeers | None = None  # None: no NetworkPolicy for runtime pods

    @property
    def credential_secret(self) -> str:
        return runtime_credential.secret_name(self.name)

    @property
    def network_policy(self) -> str:
        return f"{self.name}-runtime"


def release_labels(release: Release) -> dict[str, str]:
    return {**managed_labels(), LABEL_RELEASE: release.name}


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


def build_runtime_network_policy(release: Release, namespace: str, models: list[dict[str, Any]]) -> dict[str, Any]:
    """Runtime pods accept connections from the release's gateway and operator, each matched by its namespace
    AND its labels (one peer, both selectors: labels alone are anyone's to set in their own namespace), and
    from the monitoring namespaces (their scraper's pods only, where its labels are given). Their metrics share
    the API port, where the runtime credential guards every path but the probes' and the scraper's."""
    peers = release.peers
    home = {NAMESPACE_NAME_LABEL: release.namespace}
    port = [{"port": RUNTIME_PORT, "protocol": "TCP"}]
    ingress = [
        {"from": [{"namespaceSelector": {"matchLabels": home}, "podSelector": {"matchLabels": dict(labels)}}],
         "ports": port}
        for labels in (peers.gateway, peers.operator)
    ]
    if peers.monitoring:
        scraper: dict[str, Any] = {"namespaceSelector": {"matchLabels": dict(peers.monitoring)}}
        if peers.monitoring_pods:
            scraper["podSelector"] = {"matchLabels": dict(peers.monitoring_pods)}
        ingress.append({"from": [scraper], "ports": port})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": release.network_policy, "namespace": namespace, "labels": release_labels(release),
                     "ownerReferences": model_owner_references(models)},
        "spec": {"podSelector": {"matchLabels": runtime_pod_labels()}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }
