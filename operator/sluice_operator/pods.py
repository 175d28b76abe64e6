"""What the operator reads from a runtime pod: whether it is ready, where it listens, whether it gets requests.

The routing table and the autoscaler read the same pods by the same rules; they differ in one thing only: a
pod the autoscaler is draining is still scraped, but no longer sent requests.

Anyone who may create pods in a namespace may give one a model's labels, so the labels only say which model a
pod claims to serve: `replicas` keeps the pods whose claim the ownership chain bears out.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Iterable, Mapping

from .builders.ownership import controlled_by
from .crd import LABEL_MODEL, RUNTIME_PORT

Pod = Mapping[str, Any]

# Set on a pod the autoscaler is about to remove: the router stops sending it requests first.
DRAINING_ANNOTATION = "sluice.dev/draining"


# Set by the Deployment controller: a ReplicaSet's place in its Deployment's rollouts, and the hash of the pod
# template it stamps on the ReplicaSet and on each of its pods.
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
TEMPLATE_HASH_LABEL = "pod-template-hash"
# Injected into every pod (not its template) by the API server's ServiceAccount admission.
_INJECTED_VOLUME_PREFIX = "kube-api-access-"


def claimed_model(pod: Pod) -> str | None:
    """The InferenceModel a pod's labels say it serves (anyone may set them: see `replicas`)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_MODEL)


def _controller(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    found = [ref for ref in refs if ref.get("controller")]
    return found[0] if len(found) == 1 and found[0].get("kind") == kind else None


def _revision(obj: Mapping[str, Any]) -> int | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _hash(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(TEMPLATE_HASH_LABEL)


def _what_runs(spec: Mapping[str, Any]) -> tuple:
    """What a pod spec runs, as its template says it: the fields admission leaves alone."""
    def containers(key: str) -> list:
        return [(c.get("name"), c.get("image"), c.get("command"), c.get("args"), c.get("env"), c.get("envFrom"))
                for c in spec.get(key) or []]
    volumes = [v for v in spec.get("volumes") or [] if not v.get("name", "").startswith(_INJECTED_VOLUME_PREFIX)]
    return containers("initContainers"), containers("containers"), volumes


def _rollout_sets(deployment: Mapping[str, Any], replica_sets: Iterable[Pod]) -> dict[str, Pod]:
    """By uid, the Deployment's current ReplicaSet and the one before it (whose pods serve during a rollout)."""
    uid = deployment["metadata"].get("uid")
    current = _revision(deployment)
    owned = [rs for rs in replica_sets if (ref := _controller(rs, "Deployment"))
             and ref.get("uid") == uid and _revision(rs) is not None and _hash(rs)]
    if current is None:
        return {}
    earlier = [r for rs in owned if (r := _revision(rs)) < current]
    keep = {current, max(earlier)} if earlier else {current}
    return {rs["metadata"]["uid"]: rs for rs in owned if _revision(rs) in keep}


def replicas(pods: Iterable[Pod], replica_sets: Iterable[Pod], deployments: Iterable[Pod],
             models: Iterable[Pod]) -> list[Pod]:
    """The pods that are replicas of the model they claim (`claimed_model`): each controlled by a ReplicaSet,
    with its template hash, that is the current or previous one of a Deployment controlled by that
    InferenceModel (the check the builders make before changing a Deployment), and running what that
    ReplicaSet's template runs. All four lists are of one namespace."""
    model_uids = {m["metadata"]["name"]: m["metadata"].get("uid") for m in models}
    replica_sets = list(replica_sets)
    trusted: dict[str, dict[str, Pod]] = {}  # model → ReplicaSets by uid
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        if name in model_uids and controlled_by(dict(deployment), model_uids[name]):
            trusted[name] = _rollout_sets(deployment, replica_sets)
    kept = []
    for pod in pods:
        ref = _controller(pod, "ReplicaSet")
        rs = trusted.get(claimed_model(pod) or "", {}).get(ref.get("uid") if ref else None)
        if (rs is not None and ref.get("name") == rs["metadata"]["name"] and _hash(pod) == _hash(rs)
                and _what_runs(pod.get("spec") or {}) == _what_runs(rs["spec"]["template"].get("spec") or {})):
            kept.append(pod)
    return kept


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


def oom_killed_message(pods: Iterable[Pod]) -> str:
    """What to do about the first pod whose container the kernel killed for its memory limit, now or on its last
    run while it has not come back ready (a crash loop shows the kill only there); empty when none was. A
    container that was killed once and then came up ready is serving: its past kill is no longer a problem."""
    for pod in pods:
        limits = {c.get("name"): ((c.get("resources") or {}).get("limits") or {}).get("memory")
                  for c in (pod.get("spec") or {}).get("containers") or []}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            now = ((status.get("state") or {}).get("terminated") or {}).get("reason")
            last = ((status.get("lastState") or {}).get("terminated") or {}).get("reason")
            if now == "OOMKilled" or (last == "OOMKilled" and not status.get("ready")):
                limit = limits.get(status.get("name")) or "its memory limit"
                return (f"runtime pod {pod['metadata']['name']} was killed for using more memory than its limit "
                        f"({limit}, restarted {status.get('restartCount', 0)} times): the model, its KV cache "
                        f"(spec.runtime.kvCacheMemory) and the runtime need more; raise spec.resources.memory")
    return ""


def pending_count(pods: Iterable[Pod]) -> int:
    return sum(1 for pod in pods if (pod.get("status") or {}).get("phase") == "Pending")
