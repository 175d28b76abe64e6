"""Keep an InferenceModel's InferencePool as its spec and the chart say, and report whether a gateway took it."""
from __future__ import annotations

import json
from typing import Any

from kubernetes.client.rest import ApiException

from ..builders import Owner, controlled_by
from ..builders.inference_pool import (
    MSG_NO_PICKER,
    POOL_GROUP,
    POOL_VERSION,
    build_inference_pool,
    pool_acceptance,
    wanted_pool,
)
from ..crd import InferenceModelSpec
from ..state import OperatorState

MSG_NO_CRD = (f"the InferencePool CRD ({POOL_GROUP}/{POOL_VERSION}) is not installed; install the Gateway API "
              "Inference Extension's CRDs first (charts/sluice/README.md)")


def _message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message") or str(exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


async def sync(state: OperatorState, owner: Owner, spec: InferenceModelSpec) -> None:
    """Apply the pool, or delete ours when none is wanted; a refusal is kept for the status, never raised."""
    key = (owner.namespace, owner.name)
    enabled, picker = wanted_pool(spec, state.pool_defaults)
    if not enabled:
        state.pool_errors.pop(key, None)
        existing = await state.kube.read_pool(POOL_GROUP, POOL_VERSION, owner.namespace, owner.name)
        if existing is not None and controlled_by(existing, owner.uid):
            await state.kube.delete_pool(POOL_GROUP, POOL_VERSION, owner.namespace, owner.name)
        return
    if picker is None:
        state.pool_errors[key] = MSG_NO_PICKER
        return
    existing = await state.kube.read_pool(POOL_GROUP, POOL_VERSION, owner.namespace, owner.name)
    if existing is not None and not controlled_by(existing, owner.uid):
        state.pool_errors[key] = f"an InferencePool {owner.name} that this model did not make is in the way"
        return
    try:
        await state.kube.apply_pool(build_inference_pool(owner, picker))
    except ApiException as exc:
        if exc.status == 404:
            state.pool_errors[key] = MSG_NO_CRD
        elif 400 <= exc.status < 500:
            state.pool_errors[key] = f"the API server refused the InferencePool: {_message(exc)}"
        else:
            raise
        return
    state.pool_errors.pop(key, None)


async def pool_status(state: OperatorState, namespace: str, name: str, spec: dict[str, Any],
                      existing: dict[str, Any]) -> dict[str, Any]:
    """The status's inferencePool field; None removes it (a merge patch) from a model that has no pool now."""
    try:
        model = InferenceModelSpec.model_validate(spec)
    except ValueError:
        return {}
    enabled, _ = wanted_pool(model, state.pool_defaults)
    if not enabled:
        return {"inferencePool": None} if "inferencePool" in existing else {}
    error = state.pool_errors.get((namespace, name))
    if error is not None:
        accepted, message = "False", error
    else:
        accepted, message = pool_acceptance(await state.kube.read_pool(POOL_GROUP, POOL_VERSION, namespace, name))
    return {"inferencePool": {"name": name, "accepted": accepted, "message": message[:1024]}}
