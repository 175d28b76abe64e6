"""ModelRoutes + InferenceModels + ready endpoints → the gateway's routing table, and each route's verdict.

Pure: the handlers collect the inputs from the API server (the endpoints through `pods.ready_endpoints`, the
adapters each endpoint has loaded from the operator's adapter sync) and write the outputs back.

A model's LoRA adapters are public names of their own: one route each, whose backend lists the model's endpoints
that have the adapter loaded. A name is served once: a model's own name first, then its adapters (models in name
order), then ModelRoutes; an adapter whose name is taken is left out, and `Compiled.adapter_conflicts` says why,
and a ModelRoute whose name is taken gets the verdict NameConflict (the model keeps its route).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from sluice_contracts.routing_table import Backend, Capabilities, Route, RoutingTable

from .builders.model_version import backend_version
from .crd import InferenceModelSpec, ModelRouteSpec


@dataclass(frozen=True)
class RouteVerdict:
    """What the compiler found for one ModelRoute; the handlers turn it into status conditions."""

    ready: bool
    reason: str
    message: str
    endpoints: int
    ready_backends: int


@dataclass(frozen=True)
class Compiled:
    table: RoutingTable
    verdicts: dict[str, RouteVerdict]
    adapter_conflicts: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, adapter) → why not routed
    served: dict[str, str] = field(default_factory=dict)  # ModelRoute → the public name it serves in the table
    missing: dict[str, list[str]] = field(default_factory=dict)  # ModelRoute in the table → its backends not found


# InferenceModel name → endpoint URL → the adapters loaded there.
Loaded = Mapping[str, Mapping[str, frozenset[str]]]
# InferenceModel name → its metadata.generation.
Generations = Mapping[str, int]


def _backend(name: str, spec: InferenceModelSpec, weight: int, endpoints: Mapping[str, list[str]],
             generations: Generations, adapter: str | None = None, loaded: Loaded | None = None) -> Backend:
    urls = tuple(endpoints.get(name, ()))
    if adapter is not None:
        on = (loaded or {}).get(name, {})
        urls = tuple(url for url in urls if adapter in on.get(url, ()))
    return Backend(
        name=name,
        served_model_name=adapter or spec.served_name(name),
        adapter=adapter,
        weight=weight,
        endpoints=urls,
        capabilities=Capabilities(
            max_model_len=spec.runtime.max_model_len,
            tools=spec.capabilities.tools,
            json_schema=spec.capabilities.json_schema,
            vision=spec.capabilities.vision,
            tasks=tuple(spec.capabilities.tasks),
        ),
        engine=spec.runtime.engine,
        version=backend_version(spec, generations[name]) if name in generations else None,
    )


def _declared(spec: InferenceModelSpec) -> list[str]:
    return [a.name for a in spec.adapters or []]


def compile_routes(
    models: Mapping[str, InferenceModelSpec],
    routes: Mapping[str, ModelRouteSpec],
    endpoints: Mapping[str, list[str]],
    previous: RoutingTable | None = None,
    loaded: Loaded | None = None,
    generations: Generations | None = None,
) -> Compiled:
    """Every InferenceModel is routable under its own name, and each of its adapters under the adapter's; each
    ModelRoute adds its public name on top. A backend's version is its model's weights and generation, so a
    canary's two backends, and one model before and after an edit, answer with different versions; a model
    missing from `generations` gets none (its answers name the engine's own)."""
    generations = generations or {}
    table, adapter_owner, conflicts = _model_routes(models, endpoints, generations, loaded)
    verdicts: dict[str, RouteVerdict] = {}
    owners: dict[str, str] = {}  # public name → the ModelRoute serving it
    missing_of: dict[str, list[str]] = {}  # ModelRoute → its backends that do not exist
    for route_name, spec in sorted(routes.items()):
        refusal = _name_taken(spec.model, models, adapter_owner, owners)
        if refusal is not None:
            verdicts[route_name] = RouteVerdict(False, "NameConflict", refusal, 0, 0)
            continue
        missing = [_backend_label(b) for b in spec.backends
                   if b.inference_model not in models
                   or (b.adapter and b.adapter not in _declared(models[b.inference_model]))]
        backends = tuple(
            _backend(b.inference_model, models[b.inference_model], b.weight, endpoints, generations,
                     b.adapter or None, loaded)
            for b in spec.backends
            if _backend_label(b) not in missing
        )
        if not backends or sum(b.weight for b in backends) == 0:
            verdicts[route_name] = RouteVerdict(
                False, "BackendsMissing",
                f"no InferenceModel with a weight above 0 exists; missing: {', '.join(missing) or 'none'}", 0, 0,
            )
            continue
        owners[spec.model] = route_name
        table[spec.model] = Route(affinity=spec.affinity, backends=backends)
        missing_of[route_name] = missing
    # Fallbacks are linked once every public name is known, so a route may fall back on one compiled after it.
    for route_name, missing in missing_of.items():
        spec = routes[route_name]
        route = table[spec.model]
        table[spec.model] = route.model_copy(update={"fallbacks": tuple(f for f in spec.fallbacks if f in table)})
        verdicts[route_name] = _verdict(route.backends, missing, [f for f in spec.fallbacks if f not in table])
    compiled = RoutingTable(generation=0, routes=dict(sorted(table.items())))
    generation = _next_generation(previous, compiled)
    return Compiled(compiled.model_copy(update={"generation": generation}), verdicts, conflicts,
                    {route: name for name, route in owners.items()}, missing_of)


def _model_routes(models: Mapping[str, InferenceModelSpec], endpoints: Mapping[str, list[str]],
                  generations: Generations, loaded: Loaded | None
                  ) -> tuple[dict[str, Route], dict[str, str], dict[tuple[str, str], str]]:
    """Each model's own route and its adapters' (models in name order, a taken name left out): the routes, each
    adapter's model, and why each left-out adapter is."""
    table: dict[str, Route] = {
        name: Route(affinity="prefix", backends=(_backend(name, spec, 1, endpoints, generations),))
        for name, spec in sorted(models.items())
    }
    conflicts: dict[tuple[str, str], str] = {}
    adapter_owner: dict[str, str] = {}
    for name, spec in sorted(models.items()):
        for adapter in _declared(spec):
            if adapter in table:
                holder = adapter_owner.get(adapter)
                conflicts[(name, adapter)] = (f"the name {adapter!r} is already the adapter of InferenceModel {holder!r}"
                                              if holder else f"the name {adapter!r} is already an InferenceModel's")
                continue
            adapter_owner[adapter] = name
            table[adapter] = Route(affinity="prefix",
                                   backends=(_backend(name, spec, 1, endpoints, generations, adapter, loaded),))
    return table, adapter_owner, conflicts


def _name_taken(public_name: str, models: Mapping[str, InferenceModelSpec], adapter_owner: Mapping[str, str],
                owners: Mapping[str, str]) -> str | None:
    """Why a ModelRoute may not serve `public_name` (a model or an adapter keeps its name, the first route its
    own), or None."""
    if public_name in models:
        return (f"public model name {public_name!r} is InferenceModel {public_name!r}'s own name, which keeps it; "
                f"give the route another name")
    if public_name in adapter_owner:
        return (f"public model name {public_name!r} is the adapter {public_name!r} of InferenceModel "
                f"{adapter_owner[public_name]!r}, which keeps it; give the route another name")
    if public_name in owners:
        return f"public model name {public_name!r} is already served by ModelRoute {owners[public_name]!r}"
    return None


def _backend_label(backend: Any) -> str:
    """How messages name a ModelRoute backend: the InferenceModel, or MODEL/ADAPTER."""
    return f"{backend.inference_model}/{backend.adapter}" if backend.adapter else backend.inference_model


def backends_column(spec: dict[str, Any]) -> str:
    """`kubectl get mr`'s Backends column: each InferenceModel (or MODEL/ADAPTER) with its weight, e.g.
    smollm2=90,smollm2-canary=10."""
    backends = spec.get("backends") if isinstance(spec, dict) else None
    return ",".join(
        f"{b.get('inferenceModel')}{'/' + b['adapter'] if b.get('adapter') else ''}={b.get('weight', 1)}"
        for b in backends or [] if isinstance(b, dict)
    )


def _verdict(backends: tuple[Backend, ...], missing: list[str], unknown_fallbacks: list[str]) -> RouteVerdict:
    endpoint_count = sum(len(b.endpoints) for b in backends)
    ready_backends = sum(1 for b in backends if b.endpoints)
    if missing:
        return RouteVerdict(
            False, "BackendsMissing", f"InferenceModel (or adapter) not found: {', '.join(missing)}", endpoint_count, ready_backends
        )
    if unknown_fallbacks:
        return RouteVerdict(
            False, "FallbackMissing", f"fallback route not found: {', '.join(unknown_fallbacks)}",
            endpoint_count, ready_backends,
        )
    if endpoint_count == 0:
        return RouteVerdict(False, "NoReadyEndpoints", "no backend has a ready endpoint yet", 0, 0)
    return RouteVerdict(
        True, "Routable", f"{endpoint_count} ready endpoints across {ready_backends} of {len(backends)} backends",
        endpoint_count, ready_backends,
    )


def _next_generation(previous: RoutingTable | None, compiled: RoutingTable) -> int:
    """The generation moves only when the routes change, so recompiling the same inputs writes nothing."""
    if previous is None:
        return 1
    if previous.routes == compiled.routes:
        return previous.generation
    return previous.generation + 1
