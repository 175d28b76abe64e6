"""What the operator reads from a runtime pod: whether it is ready, where it listens, whether it gets requests.

The routing table and the autoscaler read the same pods by the same rules; they differ in one thing only: a
pod the autoscaler is draining is still scraped, but no longer sent requests.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Iterable, Mapping

from .crd import LABEL_MODEL, RUNTIME_PORT

Pod = Mapping[str, Any]

# Set on a pod the autoscaler is about to remove: the router stops sending it requests first.
DRAINING_ANNOTATION = "sluice.dev/draining"


def addresses(pod: Pod) -> list[str]:
    """The pod's IPs, dual-stack included; the primary one first."""
    status = pod.get("status") or {}
    listed = [ip["ip"] for ip in status.get("podIPs") or [] if ip.get("ip")]
    return listed or ([status["podIP"]] if status.get("podIP") else [])


def ready(pod: Pod) -> bool:
    """Passes its readiness probe, has an address and is not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp") or not addresses(pod):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def draining(pod: Pod) -> bool:
    return bool(((pod.get("metadata") or {}).get("annotations") or {}).get(DRAINING_ANNOTATION))


def serving(pod: Pod) -> bool:
    """Ready and not on its way out: the router may send it requests."""
    return ready(pod) and not draining(pod)


def base_url(address: str, port: int = RUNTIME_PORT) -> str:
    """The URL of a pod's server at one of its addresses (IPv6 in brackets): the runtime's by default."""
    try:
        is_v6 = ipaddress.ip_address(address).version == 6
    except ValueError:
        is_v6 = False
    return f"http://[{address}]:{port}" if is_v6 else f"http://{address}:{port}"


def ready_endpoints(pods: Iterable[Pod]) -> dict[str, list[str]]:
    """Runtime pods → InferenceModel name → sorted URLs of the pods that serve.

    Read from the pods themselves rather than EndpointSlices: the same facts one hop earlier, and pods carry
    the autoscaler's draining mark. A model whose pods all stand aside is listed with no URL.
    """
    found: dict[str, set[str]] = {}
    for pod in pods:
        model = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_MODEL)
        if not model:
            continue
        urls = found.setdefault(model, set())
        if serving(pod):
            urls.update(base_url(address) for address in addresses(pod))
    return {model: sorted(urls) for model, urls in found.items()}


def unschedulable_message(pods: Iterable[Pod]) -> str:
    """The scheduler's word on the first pod it cannot place; empty when it places them all."""
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return condition.get("message") or "no node fits the pod"
    return ""


def pending_count(pods: Iterable[Pod]) -> int:
    return sum(1 for pod in pods if (pod.get("status") or {}).get("phase") == "Pending")
