"""What the gateway reads from the routing table (its schema is sluice_contracts.routing_table): the routes a
tenant's request may take, the context they offer, and the table file (JSON, or YAML for hand-written files).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from sluice_contracts.model_tasks import Task
from sluice_contracts.routing_table import Route, RoutingTable, RoutingTableError, routing_table_from

from .errors import GatewayError


def reachable(table: RoutingTable, public_name: str, allowed: Callable[[str], bool],
              task: Task | None = None) -> list[tuple[str, Route]]:
    """The route of that name, then its fallbacks, theirs, ..., in the order they are tried, each with only the
    backends the tenant may be served by and that serve `task` (any task when None).

    The allow-list (`allowed`) is over public names. Only routes it allows are listed or followed, so a tenant
    allowed one model is never served by another because the first is down. A backend named like an explicit
    route is that model: it is dropped for a tenant who may not use that name, even as another route's canary.
    A backend serving an adapter is named by the adapter (every adapter is a route), so a key that may use the
    base model reaches none of its adapters it may not use. A backend with a private name is covered by the
    route that holds it. A route left with no backend that
    takes traffic is skipped (its fallbacks are still followed).
    """
    found: list[tuple[str, Route]] = []
    pending, seen = [public_name], set()
    while pending:
        name = pending.pop(0)
        route = table.route(name)
        if name in seen or route is None or not allowed(name):
            continue
        seen.add(name)
        pending.extend(route.fallbacks)
        kept = tuple(b for b in route.backends if (b.public_name not in table.routes or allowed(b.public_name))
                     and (task is None or task in b.capabilities.tasks))
        if len(kept) < len(route.backends):
            if not any(b.weight > 0 for b in kept):
                continue
            route = route.model_copy(update={"backends": kept})
        found.append((name, route))
    return found


def listed_models(table: RoutingTable, allowed: Callable[[str], bool]) -> list[str]:
    """The public names `/v1/models` shows a tenant: a name it may use whose every backend is a model it may
    not use is left out (a request for it would be 403)."""
    return [n for n in table.public_names() if allowed(n) and reachable(table, n, allowed)]


def permitted_routes(table: RoutingTable, model: str, allowed: Callable[[str], bool], task: Task,
                     path: str) -> list[tuple[str, Route]]:
    """The routes that may serve a tenant's request for `model`, else the GatewayError saying why. 403 comes
    before 404, so that whether a model exists is told only to keys that may use it."""
    if not allowed(model):
        raise GatewayError(403, f"Your key may not use the model '{model}'", param="model", code="model_not_allowed")
    routes = reachable(table, model, allowed, task)
    if routes:
        return routes
    if others := reachable(table, model, allowed):
        served = sorted({task for _, route in others for b in route.backends for task in b.capabilities.tasks})
        raise GatewayError(400, f"The model '{model}' does not serve {task} requests ({path}); it serves: "
                                f"{', '.join(served)}", param="model", code="unsupported_task")
    if table.route(model) is not None:  # it exists, but only behind backends that are models the key may not use
        raise GatewayError(403, f"Every backend of the model '{model}' is a model your key may not use",
                           param="model", code="model_not_allowed")
    raise GatewayError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")


def starting_models(routes: list[tuple[str, Route]]) -> tuple[str, ...]:
    """The models to wait for when no backend of these routes (fallbacks included) lists an endpoint: the first
    route's, scaled to zero or starting. Empty when one lists any: endpoints that are listed but failing are the
    picker's to route around, not a reason to hold."""
    if not routes or any(b.endpoints for _, route in routes for b in route.backends if b.weight > 0):
        return ()
    return tuple(dict.fromkeys(b.name for b in routes[0][1].backends if b.weight > 0))


def max_model_len(routes: list[tuple[str, Route]]) -> int | None:
    """The largest context among these routes' backends (any may serve); None if one does not say."""
    lengths = [b.capabilities.max_model_len for _, route in routes for b in route.backends if b.weight > 0]
    known = [length for length in lengths if length is not None]
    if not known or len(known) < len(lengths):
        return None
    return max(known)


def parse_routing_table(text: str | bytes) -> RoutingTable:
    """JSON (the wire format) or YAML (handy for hand-written local files)."""
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RoutingTableError(f"routing table is neither JSON nor YAML: {exc}") from None
    return routing_table_from(data)


def load_routing_table(path: str | Path) -> RoutingTable:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise RoutingTableError(f"cannot read routing table {path}: {exc.strerror}") from None
    return parse_routing_table(text)
