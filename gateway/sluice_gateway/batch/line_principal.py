"""Who a batch line runs as: the tenant that made the batch, as gateway.yaml says now (its model allow-list and
share), at the batch priority class and outside its online limits (batch lines do not count against the tenant's
RPM, TPM or concurrency, so a batch never locks its own tenant's interactive traffic out)."""
from __future__ import annotations

import hashlib

from ..auth import KeyStore, Principal
from ..config import ApiKey, GatewayConfig, Limits

_TOKEN = "sluice-batch-line"  # a key only this module knows, for a key store holding one stand-in tenant


def line_principal(config: GatewayConfig, tenant_name: str, key_id: str) -> Principal | None:
    """None when the tenant is gone from gateway.yaml: its lines are refused."""
    tenant = next((t for t in config.tenants if t.name == tenant_name), None)
    if tenant is None:
        return None
    stand_in = tenant.model_copy(update={
        "keys": (ApiKey(id=key_id, sha256=hashlib.sha256(_TOKEN.encode()).hexdigest()),),
        "limits": Limits(), "priority": config.batch_priority_class})
    return KeyStore(config.model_copy(update={"tenants": (stand_in,), "admin_keys": ()})).authenticate(
        f"Bearer {_TOKEN}")
