"""Compile a namespace's routing table from the API server and publish it as a ConfigMap for the gateway."""
from __future__ import annotations

import logging
from typing import Any

import kopf
from pydantic import ValidationError
from sluice_gateway.routing_table import RoutingTable, RoutingTableError, parse_routing_table

from ..builders import model_owner_references
from ..crd import LABEL_MODEL, Condition, InferenceModelSpec, ModelRouteSpec
from ..crd.status import merge_conditions
from ..route_compiler import RouteVerdict, compile_routes, ready_endpoints
from . import release_objects
from .model_status import now, request_refresh
from .state import OperatorState

log = logging.getLogger(__name__)

ROUTING_TABLE = "sluice-routing-table"
ROUTING_TABLE_KEY = "routing-table.json"


async def _previous(state: OperatorState, namespace: str) -> RoutingTable | None:
    if namespace in state.tables:
        return state.tables[namespace]
    existing = await state.kube.get_config_map(namespace, ROUTING_TABLE)
    text = ((existing or {}).get("data") or {}).get(ROUTING_TABLE_KEY)
    if not text:
        return None
    try:
        return parse_routing_table(text)
    except RoutingTableError:
        log.warning("replacing unreadable routing table in %s", namespace)
        return None


def _config_map(namespace: str, table: RoutingTable, models: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ROUTING_TABLE,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "sluice-operator", "app.kubernetes.io/part-of": "sluice"},
            "annotations": {"sluice.dev/generation": str(table.generation)},
            "ownerReferences": model_owner_references(models),
        },
        "data": {ROUTING_TABLE_KEY: table.to_json()},
    }


def _route_status(verdict: RouteVerdict, generation: int, existing: dict[str, Any]) -> dict[str, Any]:
    broken = verdict.reason in ("BackendsMissing", "FallbackMissing", "NameConflict", "InvalidSpec")
    wanted = [
        Condition(type="Ready", status="True" if verdict.ready else "False", reason=verdict.reason,
                  message=verdict.message),
        Condition(type="Progressing", status="False", reason="Compiled",
                  message="the route is in the routing table" if verdict.endpoints or verdict.ready
                  else "waiting for ready endpoints" if not broken else "the route cannot be compiled"),
        Condition(type="Degraded", status="True" if broken else "False",
                  reason=verdict.reason if broken else "AsExpected", message=verdict.message if broken else "no problem seen"),
    ]
    wanted = [c.model_copy(update={"observed_generation": generation}) for c in wanted]
    return {
        "observedGeneration": generation,
        "conditions": merge_conditions(existing.get("conditions") or [], wanted, now()),
        "endpoints": verdict.endpoints,
        "readyBackends": verdict.ready_backends,
    }


async def compile_namespace(state: OperatorState, namespace: str) -> None:
    with state.metrics.compile_seconds.time():
        await _compile_namespace(state, namespace)


async def _compile_namespace(state: OperatorState, namespace: str) -> None:
    kube = state.kube
    model_objs = await kube.list_custom("inferencemodels", namespace)
    route_objs = await kube.list_custom("modelroutes", namespace)
    # A model's own reconcile reports a conflict; here the namespace's objects only follow its models.
    await release_objects.sync(state, namespace, model_objs)
    if not model_objs and not route_objs:
        # No table at all rather than an empty one: nothing is left behind in the namespace, and the
        # gateway mounts the table as an optional volume, so a missing one means no routes there too.
        await kube.delete_config_map(namespace, ROUTING_TABLE)
        state.tables.pop(namespace, None)
        state.metrics.forget_namespace(namespace)
        return
    pods = await kube.list_pods(namespace, LABEL_MODEL)
    models: dict[str, InferenceModelSpec] = {}
    for obj in model_objs:
        try:
            models[obj["metadata"]["name"]] = InferenceModelSpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            continue  # its own status says why; an unreadable model is simply not routable
    routes: dict[str, ModelRouteSpec] = {}
    invalid: dict[str, RouteVerdict] = {}
    for obj in route_objs:
        try:
            routes[obj["metadata"]["name"]] = ModelRouteSpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            invalid[obj["metadata"]["name"]] = RouteVerdict(False, "InvalidSpec", str(exc.errors()[0]["msg"]), 0, 0)
    endpoints = ready_endpoints(pods)
    previous = await _previous(state, namespace)
    compiled = compile_routes(models, routes, endpoints, previous)
    if previous is None or compiled.table.generation != previous.generation:
        await kube.apply(_config_map(namespace, compiled.table, model_objs))
        log.info("routing table %s/%s generation %d", namespace, ROUTING_TABLE, compiled.table.generation)
    state.tables[namespace] = compiled.table
    state.metrics.table_generation.labels(namespace).set(compiled.table.generation)

    verdicts = {**compiled.verdicts, **invalid}
    for obj in route_objs:
        name = obj["metadata"]["name"]
        existing = obj.get("status") or {}
        status = _route_status(verdicts[name], obj["metadata"].get("generation", 1), existing)
        if status != existing:
            before = {c.get("type"): c.get("reason") for c in existing.get("conditions") or []}
            if before.get("Ready") != verdicts[name].reason:
                level = kopf.info if verdicts[name].ready else kopf.warn
                level(obj, reason=verdicts[name].reason, message=verdicts[name].message)
            await kube.patch_status("modelroutes", namespace, name, status)

    for name in models:
        count = len(endpoints.get(name, ()))
        state.metrics.endpoints.labels(namespace, name).set(count)
        if state.endpoint_counts.get((namespace, name)) != count:
            state.endpoint_counts[(namespace, name)] = count
            request_refresh(state, namespace, name)


def request_compile(state: OperatorState, namespace: str) -> None:
    state.routing.request(namespace, lambda: compile_namespace(state, namespace))
