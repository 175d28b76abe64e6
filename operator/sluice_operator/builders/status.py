"""An InferenceModel's status, from what the cluster shows: its Deployment, pods and published endpoints."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..crd import Condition
from ..crd.status import merge_conditions
from .names import GENERATION_ANNOTATION, selector_string


@dataclass(frozen=True)
class Observed:
    """Inputs gathered by the handlers; every field is what the API server returned just now."""

    name: str
    generation: int
    deployment: dict[str, Any] | None
    apply_error: tuple[str, str] | None = None  # (reason, message) of the last failed reconcile
    unschedulable: str = ""  # the scheduler's message for a pod it cannot place
    oom_killed: str = ""  # what to do about a pod killed for its memory limit
    endpoints: int | None = None


def _deployment_condition(deployment: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return {}


def _degraded(observed: Observed, deployment: dict[str, Any]) -> Condition:
    """The first problem seen, most specific first: our own apply, the scheduler, the kernel's OOM killer, the
    Deployment's rollout."""
    deadline = _deployment_condition(deployment, "Progressing")
    failure = _deployment_condition(deployment, "ReplicaFailure")
    if observed.apply_error:
        reason, message = observed.apply_error
        return Condition(type="Degraded", status="True", reason=reason, message=message)
    if observed.unschedulable:
        return Condition(type="Degraded", status="True", reason="Unschedulable",
                         message=f"a runtime pod cannot be scheduled: {observed.unschedulable}")
    if observed.oom_killed:
        return Condition(type="Degraded", status="True", reason="OOMKilled", message=observed.oom_killed)
    if deadline.get("reason") == "ProgressDeadlineExceeded":
        return Condition(type="Degraded", status="True", reason="ProgressDeadlineExceeded",
                         message=deadline.get("message", "the rollout is stuck"))
    if failure.get("status") == "True":
        return Condition(type="Degraded", status="True", reason="ReplicaFailure",
                         message=failure.get("message", "pods cannot be created"))
    return Condition(type="Degraded", status="False", reason="AsExpected", message="no problem seen")


def model_status(observed: Observed, existing: dict[str, Any], now: str) -> dict[str, Any]:
    """The full status subresource (less the autoscaler's own field), conditions merged with `existing`."""
    deployment = observed.deployment or {}
    dstatus = deployment.get("status") or {}
    desired = (deployment.get("spec") or {}).get("replicas", 0)
    ready = dstatus.get("readyReplicas", 0)
    updated = dstatus.get("updatedReplicas", 0)
    built_from = int(((deployment.get("metadata") or {}).get("annotations") or {}).get(GENERATION_ANNOTATION, 0))
    rolled_out = (
        observed.deployment is not None
        and dstatus.get("observedGeneration", 0) >= (deployment.get("metadata") or {}).get("generation", 0)
        and updated == desired == ready
        and dstatus.get("replicas", 0) == desired
    )
    gen = observed.generation

    if observed.deployment is None:
        ready_c = Condition(type="Ready", status="False", reason="DeploymentMissing",
                            message="the runtime Deployment has not been created yet")
    elif ready > 0:
        ready_c = Condition(type="Ready", status="True", reason="Serving", message=f"{ready}/{desired} replicas ready")
    elif desired == 0:
        ready_c = Condition(type="Ready", status="False", reason="ScaledToZero",
                            message="scaled to zero: the gateway holds the next request while a replica starts")
    else:
        ready_c = Condition(type="Ready", status="False", reason="NoReadyReplicas",
                            message=f"0/{desired} replicas ready; the model may still be loading")

    if rolled_out and built_from >= gen:
        progressing = Condition(type="Progressing", status="False", reason="RolloutComplete",
                                message=f"generation {gen} runs on {desired} replicas")
    else:
        progressing = Condition(type="Progressing", status="True", reason="RollingOut",
                                message=f"{updated}/{desired} replicas updated to generation {gen}, {ready} ready")

    degraded = _degraded(observed, deployment)
    wanted = [c.model_copy(update={"observed_generation": gen}) for c in (ready_c, progressing, degraded)]
    status: dict[str, Any] = {
        "observedGeneration": gen if observed.apply_error is None else existing.get("observedGeneration"),
        "conditions": merge_conditions(existing.get("conditions") or [], wanted, now),
        "replicas": dstatus.get("replicas", 0),
        "readyReplicas": ready,
        "selector": selector_string(observed.name),
    }
    endpoints = observed.endpoints if observed.endpoints is not None else existing.get("endpoints")
    if endpoints is not None:
        status["endpoints"] = endpoints
    return {k: v for k, v in status.items() if v is not None}
