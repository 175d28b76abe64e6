"""Reconcile an InferenceModel into its Deployment, Service and PodDisruptionBudget."""
from __future__ import annotations

from typing import Any

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from ..builders import Owner, build_all
from ..crd import InferenceModelSpec
from .model_status import refresh
from .state import OperatorState


def _api_message(exc: ApiException) -> str:
    import json

    try:
        return json.loads(exc.body).get("message") or str(exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


async def reconcile(state: OperatorState, body: dict[str, Any], reason: str) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    key = (namespace, name)
    try:
        spec = InferenceModelSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        state.apply_errors[key] = ("InvalidSpec", message)
        state.metrics.reconciles.labels("invalid_spec").inc()
        await refresh(state, namespace, name)
        kopf.warn(body, reason="InvalidSpec", message=message)
        raise kopf.PermanentError(message) from None
    owner = Owner(name=name, namespace=namespace, uid=meta["uid"], generation=meta.get("generation", 1))
    for manifest in build_all(owner, spec):
        try:
            await state.kube.apply(manifest)
        except ApiException as exc:
            message = f"{manifest['kind']} {name}: {_api_message(exc)}"
            if 400 <= exc.status < 500 and exc.status not in (409, 429):
                # The cluster refuses what we built (quota, admission policy): retrying will not help until
                # the spec or the cluster changes, and either brings a new event.
                state.apply_errors[key] = ("ApplyRefused", message)
                state.metrics.reconciles.labels("refused").inc()
                await refresh(state, namespace, name)
                kopf.warn(body, reason="ApplyRefused", message=message)
                raise kopf.PermanentError(message) from None
            state.metrics.reconciles.labels("retry").inc()
            raise kopf.TemporaryError(message, delay=10) from None
    state.metrics.reconciles.labels("applied").inc()
    had_error = state.apply_errors.pop(key, None) is not None
    if reason != "resume" or had_error:
        kopf.info(body, reason="Reconciled",
                  message=f"applied Deployment, Service and PodDisruptionBudget {name} for generation {owner.generation}")
    await refresh(state, namespace, name)
