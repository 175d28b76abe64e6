"""The endpoints the gateway answers itself: models, health, readiness and the admin views. Each takes the
app and the request headers and returns (status, body, content type), or raises GatewayError."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .auth import Principal, require_principal
from .errors import GatewayError
from .routing_table import reachable

if TYPE_CHECKING:
    from .app import GatewayApp

Answer = tuple[int, bytes, bytes]
_JSON = b"application/json"


def models(app: GatewayApp, headers: dict[bytes, bytes]) -> Answer:
    principal = require_principal(app.keys, headers)
    data = [_model_object(n) for n in _listed(app, principal)]
    return 200, json.dumps({"object": "list", "data": data}).encode(), _JSON


def model(app: GatewayApp, headers: dict[bytes, bytes], name: str) -> Answer:
    """`GET /v1/models/{name}`: a model the list would not show this key is one that does not exist."""
    principal = require_principal(app.keys, headers)
    if name not in _listed(app, principal):
        raise GatewayError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")
    return 200, json.dumps(_model_object(name)).encode(), _JSON


def _listed(app: GatewayApp, principal: Principal) -> list[str]:
    # A name the key may use but whose every backend is a model it may not use is not listed (it would be 403).
    return [n for n in app.table.public_names() if principal.may_use(n) and reachable(app.table, n, principal.may_use)]


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "sluice"}


def health(app: GatewayApp, headers: dict[bytes, bytes]) -> Answer:
    return 200, b'{"status":"ok"}', _JSON


def readiness(app: GatewayApp, headers: dict[bytes, bytes]) -> Answer:
    reason = app.not_ready_reason()
    if reason is not None:  # the details (paths, validation errors) are in the log, not on the API port
        raise GatewayError(503, reason, code="not_ready")
    body = {"status": "ready", "generation": app.table.generation, "routes": len(app.table.routes)}
    return 200, json.dumps(body).encode(), _JSON


def admin_routes(app: GatewayApp, headers: dict[bytes, bytes]) -> Answer:
    _admin(app, headers)
    return 200, app.table.to_json().encode(), _JSON


def admin_endpoints(app: GatewayApp, headers: dict[bytes, bytes]) -> Answer:
    _admin(app, headers)
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


def _admin(app: GatewayApp, headers: dict[bytes, bytes]) -> Principal:
    principal = require_principal(app.keys, headers)
    if not principal.admin:
        raise GatewayError(403, "this endpoint needs an admin key", code="admin_only")
    return principal


GET_ROUTES: dict[str, Callable[[GatewayApp, dict[bytes, bytes]], Answer]] = {
    "/v1/models": models,
    "/health": health,
    "/ready": readiness,
    "/admin/routes": admin_routes,
    "/admin/endpoints": admin_endpoints,
}
