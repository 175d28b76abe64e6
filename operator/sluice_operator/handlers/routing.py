"""Compile a namespace's routing table from the API server and publish it as a ConfigMap for the gateway."""
from __future__ import annotations

import logging
import time
from typing import Any

import kopf
from pydantic import ValidationError

from sluice_contracts.routing_table import RoutingTable, RoutingTableError, parse_routing_table

from ..admin_events import route_events
from ..builders import ROUTING_TABLE, ROUTING_TABLE_KEY, build_routing_table
from ..crd import LABEL_MODEL, Condition, InferenceModel, InferenceModelSpec, ModelRoute, ModelRouteSpec
from ..crd.status import merge_conditions
from ..pods import ready_endpoints
from ..route_compiler import Compiled, RouteVerdict, backends_column, compile_routes
from ..state import OperatorState
from . import release_objects
from .model_status import now, request_refresh

log = logging.getLogger(__name__)


async def _previous(state: OperatorState, namespace: str) -> RoutingTable | None:
    if namespace in state.tables:
        return state.tables[namespace]
    existing = await state.kube.read("ConfigMap", namespace, ROUTING_TABLE)
    text = ((existing or {}).get("data") or {}).get(ROUTING_TABLE_KEY)
    if not text:
        return None
    try:
        return parse_routing_table(text)
    except RoutingTableError:
        log.warning("replacing unreadable routing table in %s", namespace)
        return None


def _route_status(verdict: RouteVerdict, generation: int, existing: dict[str, Any], backends: str) -> dict[str, Any]:
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
        "backends": backends,
    }


async def compile_namespace(state: OperatorState, namespace: str) -> None:
    with state.metrics.compile_seconds.time():
        await _compile_namespace(state, namespace)


def _specs(model_objs: list[dict[str, Any]], route_objs: list[dict[str, Any]]) -> tuple[
        dict[str, InferenceModelSpec], dict[str, ModelRouteSpec], dict[str, RouteVerdict]]:
    """The specs that parse, and a verdict for each route that does not."""
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
    return models, routes, invalid


async def _publish_verdicts(state: OperatorState, namespace: str, route_objs: list[dict[str, Any]],
                            verdicts: dict[str, RouteVerdict]) -> None:
    """Each route's status, and an event when its readiness changes reason."""
    for obj in route_objs:
        name = obj["metadata"]["name"]
        existing = obj.get("status") or {}
        status = _route_status(verdicts[name], obj["metadata"].get("generation", 1), existing,
                               backends_column(obj.get("spec") or {}))
        if status != existing:
            before = {c.get("type"): c.get("reason") for c in existing.get("conditions") or []}
            if before.get("Ready") != verdicts[name].reason:
                level = kopf.info if verdicts[name].ready else kopf.warn
                level(obj, reason=verdicts[name].reason, message=verdicts[name].message)
            await state.kube.patch_status(ModelRoute.plural, namespace, name, status)


def _count_endpoints(state: OperatorState, namespace: str, model_objs: list[dict[str, Any]],
                     endpoints: dict[str, list[str]]) -> None:
    """A model whose endpoint count changed gets its status refreshed; its first endpoint ends a scale from zero."""
    for obj in model_objs:
        name = obj["metadata"]["name"]
        count = len(endpoints.get(name, ()))
        state.metrics.endpoints.labels(namespace, name).set(count)
        if state.endpoint_counts.get((namespace, name)) != count:
            state.endpoint_counts[(namespace, name)] = count
            started = state.cold_starts.pop((namespace, name), None) if count else None
            if started is not None:
                seconds = state.last_cold_start[(namespace, name)] = time.monotonic() - started
                kopf.info(obj, reason="ColdStart", message=f"scale from zero: first endpoint ready after {seconds:.1f} s")
            request_refresh(state, namespace, name)


async def _compile_namespace(state: OperatorState, namespace: str) -> None:
    kube = state.kube
    model_objs = await kube.list_custom(InferenceModel.plural, namespace)
    route_objs = await kube.list_custom(ModelRoute.plural, namespace)
    # A model's own reconcile reports a conflict; here the namespace's objects only follow its models.
    await release_objects.sync(state, namespace, model_objs)
    if not model_objs and not route_objs:
        # No table at all rather than an empty one: nothing is left behind in the namespace, and the
        # gateway mounts the table as an optional volume, so a missing one means no routes there too.
        await kube.delete("ConfigMap", namespace, ROUTING_TABLE)
        state.tables.pop(namespace, None)
        state.served_routes.pop(namespace, None)
        state.adapter_conflicts.pop(namespace, None)
        state.metrics.forget_namespace(namespace)
        return
    # A fresh LIST, not a kopf index: kopf relists after a 410 Gone or a peering pause without dropping what
    # was deleted meanwhile, and a stale pod here would be a dead (or reused) address in the routing table.
    endpoints = ready_endpoints(await kube.list_pods(namespace, LABEL_MODEL))
    models, routes, invalid = _specs(model_objs, route_objs)
    previous = await _previous(state, namespace)
    loaded = {name: found.loaded for name in models if (found := state.adapters.get((namespace, name))) is not None}
    generations = {obj["metadata"]["name"]: obj["metadata"].get("generation", 1) for obj in model_objs}
    compiled = compile_routes(models, routes, endpoints, previous, loaded, generations)
    table = compiled.table
    if previous is None or table.generation != previous.generation:
        await kube.apply(build_routing_table(namespace, table.generation, table.to_json(), model_objs))
        log.info("routing table %s/%s generation %d", namespace, ROUTING_TABLE, table.generation)
    state.tables[namespace] = table
    state.metrics.table_generation.labels(namespace).set(table.generation)
    _report_route_changes(state, namespace, route_objs, previous, compiled)
    await _publish_verdicts(state, namespace, route_objs, {**compiled.verdicts, **invalid})
    _count_endpoints(state, namespace, [obj for obj in model_objs if obj["metadata"]["name"] in models], endpoints)
    _warn_adapter_conflicts(state, namespace, model_objs, compiled.adapter_conflicts)


def _report_route_changes(state: OperatorState, namespace: str, route_objs: list[dict[str, Any]],
                          previous: RoutingTable | None, compiled: Compiled) -> None:
    """A RoutesChanged event on each ModelRoute whose route in the table changed since the last compile."""
    served = {route: compiled.table.routes[name] for route, name in compiled.served.items()}
    before = state.served_routes.get(namespace)
    if before is None:
        # The first compile since the operator started: what the table it found routes under each public name is
        # what was routed, so a restart reports nothing, and an edit made meanwhile is reported once.
        known = previous.routes if previous is not None else {}
        before = {route: known[name] for route, name in compiled.served.items() if name in known}
    state.served_routes[namespace] = served
    by_name = {obj["metadata"]["name"]: obj for obj in route_objs}
    for route, event in route_events(before, served, compiled.missing).items():
        if route in by_name:
            kopf.info(by_name[route], reason=event.reason, message=event.message)


def _warn_adapter_conflicts(state: OperatorState, namespace: str, model_objs: list[dict[str, Any]],
                            conflicts: dict[tuple[str, str], str]) -> None:
    """A Warning event on the model whose adapter is left out of the table, once per conflict."""
    seen = state.adapter_conflicts.setdefault(namespace, set())
    by_name = {obj["metadata"]["name"]: obj for obj in model_objs}
    for (model, adapter), message in conflicts.items():
        if (model, adapter) not in seen and model in by_name:
            kopf.warn(by_name[model], reason="AdapterNameConflict",
                      message=f"adapter {adapter} is not routed: {message}; rename it")
    seen.intersection_update(conflicts)
    seen.update(conflicts)


def request_compile(state: OperatorState, namespace: str) -> None:
    state.routing.request(namespace, lambda: compile_namespace(state, namespace))
