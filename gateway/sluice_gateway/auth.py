"""Bearer key → tenant, and which public model names a tenant may use.

Keys are compared by SHA-256 digest only; the key itself never leaves this module, callers log `key_id`.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from fnmatch import translate

from sluice_contracts.request_priority import DEFAULT_SHARE

from .config import GatewayConfig, Limits
from .errors import GatewayError


@dataclass(frozen=True, slots=True)
class Rank:
    """Where a tenant's requests stand (gateway.yaml `priority`): its class, the class's number (lower is more
    urgent), its share, and how the number compares with the default class's (-1 more urgent, 0, 1 less)."""

    priority_class: str
    number: int
    share: float
    urgency: int


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    key_id: str
    limits: Limits
    model_pattern: re.Pattern[str]
    rank: Rank
    admin: bool = False

    def may_use(self, model: str) -> bool:
        return self.admin or self.model_pattern.match(model) is not None


class KeyStore:
    def __init__(self, config: GatewayConfig) -> None:
        self._by_digest: dict[str, Principal] = {}
        self._patterns: dict[str, re.Pattern[str]] = {}
        classes = config.priority
        default = classes.number(None)

        def rank(name: str | None, share: float) -> Rank:
            number = classes.number(name)
            return Rank(name or classes.default_class, number, share, (number > default) - (number < default))

        for tenant in config.tenants:
            pattern = re.compile("|".join(f"(?:{translate(glob)})" for glob in tenant.models) or "(?!)")
            self._patterns[tenant.name] = pattern
            for key in tenant.keys:
                self._by_digest[key.sha256] = Principal(
                    tenant.name, key.id, tenant.limits, pattern, rank(tenant.priority, tenant.share))
        for key in config.admin_keys:
            self._by_digest[key.sha256] = Principal(
                "admin", key.id, Limits(), re.compile("(?!)"), rank(None, DEFAULT_SHARE), admin=True)
        self._batch_rank = {t.name: rank(config.batch_priority_class, t.share) for t in config.tenants}

    def batch_line(self, tenant: str, key_id: str) -> Principal | None:
        """Who a batch line runs as: the tenant that made the batch, as gateway.yaml says now (its model allow-list
        and share), at the batch priority class and outside its online limits (batch lines do not count against
        the tenant's RPM, TPM or concurrency, so a batch never locks its own tenant's interactive traffic out).
        None when the tenant is gone from gateway.yaml: its lines are refused."""
        if tenant not in self._patterns:
            return None
        return Principal(tenant, key_id, Limits(), self._patterns[tenant], self._batch_rank[tenant])

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal behind an `Authorization: Bearer KEY` header, or None when missing or unknown."""
        if not authorization:
            return None
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return None
        return self._by_digest.get(hashlib.sha256(key.encode()).hexdigest())


def require_principal(keys: KeyStore, headers: dict[bytes, bytes]) -> Principal:
    """The principal of a request's `Authorization` header, or 401 in the API's format."""
    authorization = headers.get(b"authorization")
    principal = keys.authenticate(authorization.decode(errors="replace") if authorization else None)
    if principal is None:
        message = ("Missing API key: send it as 'Authorization: Bearer KEY'" if not authorization
                   else "Incorrect API key provided")
        raise GatewayError(401, message, code="invalid_api_key")
    return principal
