"""Write an InferenceModel's status from what its Deployment and pods show right now."""
from __future__ import annotations

import datetime
from typing import Any

from ..builders import Observed, controlled_by, model_status, selector_string
from .state import OperatorState

PLURAL = "inferencemodels"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def unschedulable_message(pods: list[dict[str, Any]]) -> str:
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return condition.get("message") or "no node fits the pod"
    return ""


async def refresh(state: OperatorState, namespace: str, name: str) -> None:
    model = await state.kube.get_custom(PLURAL, namespace, name)
    if model is None:
        return
    uid = model["metadata"]["uid"]
    deployment = await state.kube.get_deployment(namespace, name)
    pods = await state.kube.list_pods(namespace, selector_string(name))
    observed = Observed(
        name=name,
        generation=model["metadata"].get("generation", 1),
        deployment=deployment if deployment is not None and controlled_by(deployment, uid) else None,
        apply_error=state.apply_errors.get((namespace, name)),
        unschedulable=unschedulable_message(pods),
        endpoints=state.endpoint_counts.get((namespace, name)),
    )
    existing = model.get("status") or {}
    status = model_status(observed, existing, now())
    decision = state.decisions.get((namespace, name))
    if decision is not None:
        status["autoscaler"] = decision
    elif "autoscaler" in existing:
        status["autoscaler"] = existing["autoscaler"]
    if status != existing:
        await state.kube.patch_status(PLURAL, namespace, name, status)


def request_refresh(state: OperatorState, namespace: str, name: str) -> None:
    state.statuses.request((namespace, name), lambda: refresh(state, namespace, name))
