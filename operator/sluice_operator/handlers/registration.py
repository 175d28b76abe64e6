"""Wire the handlers to kopf: which events of which resources call what."""
from __future__ import annotations

import logging
from typing import Any

import kopf

from ..builders.inference_pool import pool_enabled
from ..crd import GROUP, LABEL_MODEL, MANAGED_BY, VERSION, InferenceModel, ModelRoute
from ..state import OperatorState
from . import adapters, autoscaling, inference_model, scale_from_zero
from .model_status import request_refresh
from .routing import request_compile

MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}
POOL_STATUS_SECONDS = 10.0


def register(registry: kopf.OperatorRegistry, state: OperatorState) -> None:
    @kopf.on.create(GROUP, VERSION, InferenceModel.plural, registry=registry)
    @kopf.on.update(GROUP, VERSION, InferenceModel.plural, registry=registry)
    @kopf.on.resume(GROUP, VERSION, InferenceModel.plural, registry=registry)
    async def reconcile_model(body: kopf.Body, reason: Any, **_: Any) -> None:
        await inference_model.reconcile(state, dict(body), str(getattr(reason, "value", reason)))
        adapters.request_sync(state, body["metadata"]["namespace"], body["metadata"]["name"])

    @kopf.on.event(GROUP, VERSION, InferenceModel.plural, registry=registry)
    async def model_changed(type: str, namespace: str, name: str, uid: str, **_: Any) -> None:
        if type == "DELETED":
            state.forget(namespace, name, uid)
        request_compile(state, namespace)

    @kopf.on.event(GROUP, VERSION, ModelRoute.plural, registry=registry)
    async def route_changed(namespace: str, **_: Any) -> None:
        request_compile(state, namespace)

    @kopf.on.event("", "v1", "pods", labels={LABEL_MODEL: kopf.PRESENT}, registry=registry)
    async def pod_changed(namespace: str, labels: kopf.Labels, **_: Any) -> None:
        request_compile(state, namespace)
        request_refresh(state, namespace, labels[LABEL_MODEL])
        adapters.request_sync(state, namespace, labels[LABEL_MODEL])

    @kopf.on.event("apps", "v1", "deployments", labels={**MANAGED, LABEL_MODEL: kopf.PRESENT}, registry=registry)
    async def deployment_changed(namespace: str, labels: kopf.Labels, **_: Any) -> None:
        request_refresh(state, namespace, labels[LABEL_MODEL])

    @kopf.timer(GROUP, VERSION, InferenceModel.plural, interval=state.autoscale_interval,
                when=lambda spec, **_: bool(spec.get("autoscaling")), registry=registry)
    async def autoscale(body: kopf.Body, namespace: str, name: str, uid: str, logger: logging.Logger, **_: Any) -> None:
        await autoscaling.tick(state, dict(body), namespace, name, uid)

    # A gateway accepting a pool writes the pool's status, which brings no event here: look again now and then.
    @kopf.timer(GROUP, VERSION, InferenceModel.plural, interval=POOL_STATUS_SECONDS,
                when=lambda spec, **_: pool_enabled(spec, state.pool_defaults), registry=registry)
    async def refresh_pool_status(namespace: str, name: str, **_: Any) -> None:
        request_refresh(state, namespace, name)

    @kopf.timer(GROUP, VERSION, InferenceModel.plural, interval=adapters.RESYNC_SECONDS,
                when=lambda spec, **_: spec.get("adapters") is not None, registry=registry)
    async def resync_adapters(namespace: str, name: str, **_: Any) -> None:
        adapters.request_sync(state, namespace, name)

    # A daemon, not a timer: it runs every demand interval without a log line each time, and, like timers, only
    # in the leading replica (kopf stops daemons while peering pauses the operator).
    @kopf.daemon(GROUP, VERSION, InferenceModel.plural, cancellation_timeout=1.0,
                 when=lambda spec, **_: (spec.get("autoscaling") or {}).get("minReplicas") == 0, registry=registry)
    async def wake_from_zero(body: kopf.Body, namespace: str, name: str, uid: str, stopped: Any, **_: Any) -> None:
        await scale_from_zero.run(state, body, namespace, name, uid, stopped)
