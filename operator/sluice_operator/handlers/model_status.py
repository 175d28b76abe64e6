"""Write an InferenceModel's status from what its Deployment and pods show right now."""
from __future__ import annotations

import datetime

import kopf

from ..builders import Observed, controlled_by, model_status, selector_string
from ..builders.adapter_status import adapters_status
from ..crd import InferenceModel
from ..pods import oom_killed_message, unschedulable_message
from ..state import OperatorState
from . import inference_pool


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


async def refresh(state: OperatorState, namespace: str, name: str) -> None:
    model = await state.kube.get_custom(InferenceModel.plural, namespace, name)
    if model is None:
        return
    uid = model["metadata"]["uid"]
    deployment = await state.kube.read("Deployment", namespace, name)
    pods = await state.kube.list_pods(namespace, selector_string(name))
    observed = Observed(
        name=name,
        generation=model["metadata"].get("generation", 1),
        deployment=deployment if deployment is not None and controlled_by(deployment, uid) else None,
        apply_error=state.apply_errors.get((namespace, name)),
        unschedulable=unschedulable_message(pods),
        oom_killed=oom_killed_message(pods),
        endpoints=state.endpoint_counts.get((namespace, name)),
    )
    existing = model.get("status") or {}
    status = model_status(observed, existing, now())
    decision = state.decisions.get((namespace, name))
    if decision is not None:
        status["autoscaler"] = decision
    elif "autoscaler" in existing:
        status["autoscaler"] = existing["autoscaler"]
    status.update(_adapters(state, namespace, name, model))
    status.update(await inference_pool.pool_status(state, namespace, name, model.get("spec") or {}, existing))
    cold_start = state.last_cold_start.get((namespace, name))
    if cold_start is not None:
        status["lastColdStartSeconds"] = round(cold_start, 2)
    elif "lastColdStartSeconds" in existing:
        status["lastColdStartSeconds"] = existing["lastColdStartSeconds"]
    if status != existing:
        await state.kube.patch_status(InferenceModel.plural, namespace, name, status)
    # Once, as the condition turns to it: a problem shown first (the scheduler's) would otherwise repeat it on
    # every pod event.
    if _degraded_reason(status) == "OOMKilled" != _degraded_reason(existing):
        kopf.warn(model, reason="OOMKilled", message=observed.oom_killed)


def _degraded_reason(status: dict) -> str | None:
    return next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "Degraded"), None)


def _adapters(state: OperatorState, namespace: str, name: str, model: dict) -> dict:
    """The adapters part of the status; None values remove it (a merge patch) from a model that has none now."""
    declared = ((model.get("spec") or {}).get("adapters"))
    if declared is None:
        return {"adapters": None, "adaptersReady": None} if "adapters" in (model.get("status") or {}) else {}
    synced = state.adapters.get((namespace, name))
    names = [a.get("name") for a in declared if isinstance(a, dict) and isinstance(a.get("name"), str)]
    return adapters_status(names, synced.replicas if synced is not None else {})


def request_refresh(state: OperatorState, namespace: str, name: str) -> None:
    state.statuses.request((namespace, name), lambda: refresh(state, namespace, name))
