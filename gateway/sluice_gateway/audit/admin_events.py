"""The admin events of the audit trail: what a reload of gateway.yaml changed in who may call (keys added and
removed, by tenant and key id: a key whose digest changed under the same id is one removed and one added), a
file the gateway rejected, and what a new routing table changed in where requests go (routes and backends added
and removed, weights). Endpoints coming and going are the operator's scaling, not an admin's decision: no event."""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sluice_contracts.routing_table import RoutingTable

from ..config import GatewayConfig

_ADMIN = "admin"  # what the tenant field of an admin key's event says


def key_events(old: GatewayConfig, new: GatewayConfig) -> list[dict[str, Any]]:
    before, after = _keys(old), _keys(new)
    return [event("key_removed", tenant=tenant, key_id=key_id) for tenant, key_id, _ in sorted(before - after)] + [
        event("key_added", tenant=tenant, key_id=key_id) for tenant, key_id, _ in sorted(after - before)]


def table_event(old: RoutingTable, new: RoutingTable) -> dict[str, Any] | None:
    """One event naming every route, backend and weight the new table changed; None when it changed none."""
    before, after = _weights(old), _weights(new)
    routes_added = sorted(set(new.routes) - set(old.routes))
    routes_removed = sorted(set(old.routes) - set(new.routes))
    backends_added = sorted(f"{route}/{name}" for route, name in set(after) - set(before))
    backends_removed = sorted(f"{route}/{name}" for route, name in set(before) - set(after))
    weights = {f"{route}/{name}": {"from": before[route, name], "to": weight}
               for (route, name), weight in sorted(after.items())
               if (route, name) in before and before[route, name] != weight}
    if not (routes_added or routes_removed or backends_added or backends_removed or weights):
        return None
    return event("routes_changed", generation=new.generation, routes_added=routes_added,
                 routes_removed=routes_removed, backends_added=backends_added, backends_removed=backends_removed,
                 weights=weights)


def event(name: str, **fields: Any) -> dict[str, Any]:
    return {"audit": "admin", "time": datetime.now(UTC).isoformat(timespec="milliseconds"), "event": name, **fields}


def _keys(config: GatewayConfig) -> set[tuple[str, str, str]]:
    keys = {(tenant.name, key.id, key.sha256) for tenant in config.tenants for key in tenant.keys}
    return keys | {(_ADMIN, key.id, key.sha256) for key in config.admin_keys}


def _weights(table: RoutingTable) -> dict[tuple[str, str], int]:
    return {(route, backend.public_name): backend.weight
            for route, spec in table.routes.items() for backend in spec.backends}
