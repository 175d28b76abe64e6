"""The endpoints the gateway answers itself: models, health, readiness and the admin views (the usage report,
which reads a store and its query, is in usage/). Each takes the
gateway's `Served` state and the request headers and returns (status, body, content type), or raises
GatewayError."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Protocol

from sluice_contracts.routing_table import RoutingTable

from .auth import KeyStore, Principal, require_principal
from .errors import GatewayError
from .picker import Picker
from .routing_table import listed_models

Answer = tuple[int, bytes, bytes]
_JSON = b"application/json"


class Served(Protocol):
    """What the built-in endpoints read of the running gateway: its keys, table and endpoints, as of now."""

    @property
    def keys(self) -> KeyStore: ...
    @property
    def table(self) -> RoutingTable: ...
    @property
    def picker(self) -> Picker: ...
    def not_ready_reason(self) -> str | None: ...


def models(app: Served, headers: dict[bytes, bytes]) -> Answer:
    principal = require_principal(app.keys, headers)
    data = [_model_object(n) for n in _listed(app, principal)]
    return 200, json.dumps({"object": "list", "data": data}).encode(), _JSON


def model(app: Served, headers: dict[bytes, bytes], name: str) -> Answer:
    """`GET /v1/models/{name}`: a model the list would not show this key is one that does not exist."""
    principal = require_principal(app.keys, headers)
    if name not in _listed(app, principal):
        raise GatewayError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")
    return 200, json.dumps(_model_object(name)).encode(), _JSON


def _listed(app: Served, principal: Principal) -> list[str]:
    return listed_models(app.table, principal.may_use)


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "sluice"}


def health(app: Served, headers: dict[bytes, bytes]) -> Answer:
    return 200, b'{"status":"ok"}', _JSON


def readiness(app: Served, headers: dict[bytes, bytes]) -> Answer:
    reason = app.not_ready_reason()
    if reason is not None:  # the details (paths, validation errors) are in the log, not on the API port
        raise GatewayError(503, reason, code="not_ready")
    body = {"status": "ready", "generation": app.table.generation, "routes": len(app.table.routes)}
    return 200, json.dumps(body).encode(), _JSON


def admin_routes(app: Served, headers: dict[bytes, bytes]) -> Answer:
    require_admin(app.keys, headers)
    return 200, app.table.to_json().encode(), _JSON


def admin_endpoints(app: Served, headers: dict[bytes, bytes]) -> Answer:
    require_admin(app.keys, headers)
    now = time.monotonic()
    data = [
        {"url": s.url, "available": s.available(now), "healthy": s.healthy, "waiting": s.waiting,
         "running": s.running, "kv_cache_usage": s.kv_cache_usage, "in_flight": s.in_flight,
         "loaded_adapters": sorted(s.loaded_adapters),
         "ejected_for_s": round(max(s.ejected_until - now, 0.0), 3),
         "polled_s_ago": round(now - s.polled_at, 3) if s.polled_at else None}
        for s in app.picker.endpoints()
    ]
    return 200, json.dumps({"endpoints": data}).encode(), _JSON


def require_admin(keys: KeyStore, headers: dict[bytes, bytes]) -> Principal:
    """The admin key's principal; 401 without a known key, 403 for a tenant's."""
    principal = require_principal(keys, headers)
    if not principal.admin:
        raise GatewayError(403, "this endpoint needs an admin key", code="admin_only")
    return principal


GET_ROUTES: dict[str, Callable[[Served, dict[bytes, bytes]], Answer]] = {
    "/v1/models": models,
    "/health": health,
    "/ready": readiness,
    "/admin/routes": admin_routes,
    "/admin/endpoints": admin_endpoints,
}
