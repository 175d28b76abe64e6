"""The autoscaler tick of one InferenceModel: scrape its ready pods, decide, drain, scale, report.

A model that scales to zero also has an idle clock, kept from the gateways' demand (observe_demand).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

import aiohttp
import kopf

from ..autoscaler import (
    Decision,
    DemandClock,
    History,
    MetricsError,
    Observation,
    PodSample,
    Targets,
    decide,
    pick_victims,
    scrape,
)
from ..builders import selector_string
from ..crd import InferenceModel, InferenceModelSpec
from ..crd.inference_model import AutoscalerDecision, AutoscalerMetrics
from ..pods import DRAINING_ANNOTATION, addresses, base_url, pending_count, ready, unschedulable_message
from ..state import OperatorState, PendingDrain
from .model_status import now, request_refresh
from .routing import request_compile

log = logging.getLogger(__name__)
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


async def _observe(pods: list[dict[str, Any]], served: str, engine: str, current: int) -> Observation:
    # A draining pod is still scraped: the scale-down that follows needs to see it.
    scraped = [p for p in pods if ready(p)]
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(scrape(session, base_url(addresses(p)[0]), served, engine) for p in scraped), return_exceptions=True
        )
    samples, failures = [], []
    for pod, result in zip(scraped, results):
        name = pod["metadata"]["name"]
        if isinstance(result, MetricsError):
            failures.append((name, str(result)))
        elif isinstance(result, BaseException):
            failures.append((name, f"scrape failed: {type(result).__name__}"))
        else:
            samples.append(PodSample(name, result.kv_cache_usage, result.waiting, result.running))
    unschedulable = unschedulable_message(pods)
    pending = pending_count(pods) if unschedulable else 0
    return Observation(current, tuple(samples), tuple(failures), pending, unschedulable)


async def observe_demand(state: OperatorState, namespace: str, name: str, uid: str) -> DemandClock | None:
    """The model's idle clock, brought up to date from the gateways; None when no gateway serves its namespace
    (nothing would bring it back from zero, so it never goes there)."""
    reader = state.gateway_demand
    if reader is None or reader.source.namespace != namespace:
        return None
    demand = await reader.read()
    now = time.monotonic()
    clock = state.clocks.setdefault(uid, DemandClock(now))
    clock.observe(now, demand.get(name, {}))
    return clock


async def set_draining(state: OperatorState, namespace: str, pods: list[str], draining: bool) -> None:
    annotations = {DRAINING_ANNOTATION: "true", DELETION_COST: "-1000"} if draining else {
        DRAINING_ANNOTATION: None, DELETION_COST: None}
    await asyncio.gather(*(state.kube.annotate_pod(namespace, pod, annotations) for pod in pods))
    request_compile(state, namespace)


async def _drain_first(state: OperatorState, namespace: str, uid: str, decision: Decision,
                       samples: tuple[PodSample, ...]) -> tuple[int, str]:
    """The replicas to ask for now, and why. A scale-down first takes its victims out of the routing table and
    holds; the next tick, finding the same victims still drained, removes them once no new request arrives."""
    desired, reason = decision.desired_replicas, decision.reason
    pending = state.drains.get(uid)
    if decision.action == "ScaleDown" and samples:
        victims = pick_victims(samples, decision.current_replicas - desired)
        if pending is None or pending.replicas != desired or not set(pending.pods) <= {s.pod for s in samples}:
            if pending is not None:
                await set_draining(state, namespace, pending.pods, False)
            state.drains[uid] = PendingDrain(victims, desired)
            await set_draining(state, namespace, victims, True)
            return decision.current_replicas, f"{reason}; draining {', '.join(victims)} first"
        state.drains.pop(uid, None)
    elif pending is not None:
        state.drains.pop(uid, None)
        await set_draining(state, namespace, pending.pods, False)
    return desired, reason


async def tick(state: OperatorState, body: dict[str, Any], namespace: str, name: str, uid: str) -> None:
    spec = InferenceModelSpec.model_validate(body.get("spec") or {})
    auto = spec.autoscaling
    if auto is None:
        return
    targets = Targets(auto.min_replicas, auto.max_replicas, auto.target_kv_cache_usage,
                      auto.target_waiting_per_replica, auto.scale_up_window_seconds, auto.scale_down_window_seconds,
                      auto.scale_to_zero_after_seconds)
    pods = await state.kube.list_pods(namespace, selector_string(name))
    observation = await _observe(pods, spec.served_name(name), spec.runtime.engine, spec.replicas)
    if auto.scales_to_zero and (clock := await observe_demand(state, namespace, name, uid)) is not None:
        if any(s.running or s.waiting for s in observation.samples):
            clock.touch(time.monotonic())
        observation = replace(observation, held=clock.held, idle_seconds=clock.idle_seconds(time.monotonic()))
    history = state.histories.setdefault(uid, History())
    decision = decide(targets, observation, history, time.monotonic())

    desired, reason = await _drain_first(state, namespace, uid, decision, observation.samples)
    record = AutoscalerDecision(
        time=now(),
        action="Hold" if desired == decision.current_replicas else decision.action,
        current_replicas=decision.current_replicas,
        desired_replicas=desired,
        reason=reason,
        metrics=AutoscalerMetrics(pods_scraped=decision.pods_scraped, kv_cache_usage=decision.kv_cache_usage,
                                  waiting=decision.waiting, running=decision.running),
    ).wire()
    previous = state.decisions.get((namespace, name))
    state.decisions[(namespace, name)] = record
    state.metrics.decisions.labels(namespace, name, record["action"]).inc()
    state.metrics.desired_replicas.labels(namespace, name).set(desired)
    if observation.failures:
        state.metrics.scrape_failures.labels(namespace, name).inc(len(observation.failures))
    if desired != decision.current_replicas:
        if decision.current_replicas == 0:
            state.cold_starts.setdefault((namespace, name), time.monotonic())
        await state.kube.scale(InferenceModel.plural, namespace, name, desired)
        kopf.info(body, reason="Scaled", message=f"{decision.current_replicas} → {desired} replicas: {reason}")
        log.info("%s/%s: %d → %d (%s)", namespace, name, decision.current_replicas, desired, reason)
    elif previous is None or previous.get("reason", "").split(":")[0] != reason.split(":")[0]:
        if observation.unschedulable_pods or observation.failures:
            kopf.warn(body, reason="AutoscalerHold", message=reason)
    request_refresh(state, namespace, name)
