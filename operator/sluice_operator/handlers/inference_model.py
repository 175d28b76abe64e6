"""Reconcile an InferenceModel into its Deployment, Service and PodDisruptionBudget.

An object of one of those names that the model did not make (no controller reference to it) is never taken
over: the model reports the conflict and waits, and nothing is applied until the name is free.
"""
from __future__ import annotations

import json
from typing import Any

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from ..builders import (
    NoGuardImage,
    Owner,
    build_all,
    conflict_message,
    foreign,
    image_allowed,
    image_refusal,
    token_secret_refusal,
)
from ..crd import InferenceModel, InferenceModelSpec
from ..state import OperatorState
from . import inference_pool, release_objects
from .model_status import refresh


def _api_message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message") or str(exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


# A conflict ends when someone removes the foreign object, which brings no event to the model: look again.
# The same for a token Secret that is missing or not open to models yet.
CONFLICT_RETRY_SECONDS = 15


async def _report(state: OperatorState, body: dict[str, Any], key: tuple[str, str], reason: str, message: str,
                  outcome: str) -> None:
    """Why the model cannot be applied: in its status, and once as a Warning event."""
    repeated = state.apply_errors.get(key) == (reason, message)
    state.apply_errors[key] = (reason, message)
    state.metrics.reconciles.labels(outcome).inc()
    await refresh(state, *key)
    if not repeated:
        kopf.warn(body, reason=reason, message=message)


async def reconcile(state: OperatorState, body: dict[str, Any], reason: str) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    key = (namespace, name)
    try:
        spec = InferenceModelSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        await _report(state, body, key, "InvalidSpec", message, "invalid_spec")
        raise kopf.PermanentError(message) from None
    owner = Owner(name=name, namespace=namespace, uid=meta["uid"], generation=meta.get("generation", 1))
    prefixes = state.policy.image_prefixes
    if prefixes and spec.runtime.image is not None and not image_allowed(spec.runtime.image, prefixes):
        message = image_refusal(spec.runtime.image, prefixes)
        await _report(state, body, key, "ImageNotAllowed", message, "refused")
        raise kopf.PermanentError(message)
    token = spec.model.token_secret
    if token is not None:
        # Read by name, as the pod would; only its labels and keys are looked at.
        try:
            refusal = token_secret_refusal(await state.kube.read("Secret", namespace, token.name), token.name, token.key)
        except ApiException as exc:
            refusal = f"model.tokenSecret: cannot read Secret {token.name!r}: {_api_message(exc)}"
        if refusal is not None:
            await _report(state, body, key, "TokenSecretNotAllowed", refusal, "refused")
            raise kopf.TemporaryError(refusal, delay=CONFLICT_RETRY_SECONDS)
    if state.release is not None and state.credential is None:
        raise kopf.TemporaryError("waiting for the runtime credential", delay=2)
    in_the_way = await release_objects.sync(state, namespace, await state.kube.list_custom(InferenceModel.plural, namespace),
                                            always=True)
    deployment = await state.kube.read("Deployment", namespace, name)
    try:
        manifests = build_all(owner, spec, state.release, state.engine_images, deployment, state.policy.guard_image)
    except NoGuardImage as exc:
        await _report(state, body, key, "NoEngineGuard", str(exc), "refused")
        raise kopf.PermanentError(str(exc)) from None
    existing = [deployment if m["kind"] == "Deployment" else await state.kube.read(m["kind"], namespace, name)
                for m in manifests]
    in_the_way += foreign(manifests, existing, owner.uid)
    if in_the_way:
        message = conflict_message(in_the_way)
        await _report(state, body, key, "NameConflict", message, "conflict")
        raise kopf.TemporaryError(message, delay=CONFLICT_RETRY_SECONDS)
    for manifest, obj in zip(manifests, existing):
        try:
            # Created without force: should someone else create the name meanwhile, that is a 409, retried.
            await state.kube.apply(manifest, force=obj is not None)
        except ApiException as exc:
            message = f"{manifest['kind']} {name}: {_api_message(exc)}"
            if 400 <= exc.status < 500 and exc.status not in (409, 429):
                # The cluster refuses what we built (quota, admission policy): retrying will not help until
                # the spec or the cluster changes, and either brings a new event.
                await _report(state, body, key, "ApplyRefused", message, "refused")
                raise kopf.PermanentError(message) from None
            state.metrics.reconciles.labels("retry").inc()
            raise kopf.TemporaryError(message, delay=10) from None
    await inference_pool.sync(state, owner, spec)
    state.metrics.reconciles.labels("applied").inc()
    had_error = state.apply_errors.pop(key, None) is not None
    if reason != "resume" or had_error:
        kopf.info(body, reason="Reconciled",
                  message=f"applied Deployment, Service and PodDisruptionBudget {name} for generation {owner.generation}")
    await refresh(state, namespace, name)
