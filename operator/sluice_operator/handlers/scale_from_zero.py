"""The fast path back from zero: every demand interval, a model at zero (or draining to it) with requests held at
a gateway gets a replica at once, without waiting for the autoscaler's tick."""
from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from ..crd import InferenceModel, InferenceModelSpec
from ..crd.inference_model import AutoscalerDecision
from ..state import OperatorState
from .autoscaling import observe_demand, set_draining
from .model_status import now, request_refresh

log = logging.getLogger(__name__)
# A scale from zero just asked for: the body a timer gets may not show it yet, and asking twice would say so twice.
RECENT_SECONDS = 10.0


async def run(state: OperatorState, body: Any, namespace: str, name: str, uid: str, stopped: Any) -> None:
    """Every demand interval until kopf stops the daemon; `body` is kopf's live view of the model."""
    while not stopped:
        try:
            await tick(state, dict(body), namespace, name, uid)
        except Exception:  # the next round tries again; one failed API call must not end the daemon
            log.exception("%s/%s: scale from zero failed", namespace, name)
        await stopped.wait(state.demand_interval)


async def tick(state: OperatorState, body: dict[str, Any], namespace: str, name: str, uid: str) -> None:
    spec = InferenceModelSpec.model_validate(body.get("spec") or {})
    if spec.autoscaling is None or not spec.autoscaling.scales_to_zero:
        return
    clock = await observe_demand(state, namespace, name, uid)
    if clock is None or not clock.held:
        return
    reason = f"scale from zero: {clock.held} requests held"
    if spec.replicas == 0:
        started = state.cold_starts.get((namespace, name))
        if started is not None and time.monotonic() - started < RECENT_SECONDS:
            return
        await state.kube.scale(InferenceModel.plural, namespace, name, 1)
        state.cold_starts[(namespace, name)] = started or time.monotonic()
        state.decisions[(namespace, name)] = AutoscalerDecision(
            time=now(), action="ScaleUp", current_replicas=0, desired_replicas=1, reason=reason).wire()
        state.metrics.decisions.labels(namespace, name, "ScaleUp").inc()
        state.metrics.desired_replicas.labels(namespace, name).set(1)
        kopf.info(body, reason="Scaled", message=f"0 → 1 replicas: {reason}")
        log.info("%s/%s: 0 → 1 (%s)", namespace, name, reason)
        request_refresh(state, namespace, name)
        return
    pending = state.drains.get(uid)
    if pending is not None and pending.replicas == 0:
        # The last replicas were leaving the routing table on their way to zero: they stay.
        state.drains.pop(uid, None)
        await set_draining(state, namespace, pending.pods, False)
        kopf.info(body, reason="ScaleDownCancelled", message=f"not scaling to zero: {clock.held} requests held")
        log.info("%s/%s: scale to zero cancelled, %d requests held", namespace, name, clock.held)
