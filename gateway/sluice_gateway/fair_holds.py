"""Counting held requests per model, and per tenant within a model, so that no tenant fills a hold alone.

A model's hold takes at most `limit` requests; a tenant at most `limit // (k + 2)` of them (at least one), k
being the number of other tenants holding requests for that model now. Alone, a tenant gets half; each tenant
that joins lowers everyone's share, and there is always room for a tenant that holds nothing yet, until the
hold is full.
"""
from __future__ import annotations

from collections import Counter
from typing import Literal


class FairHolds:
    def __init__(self) -> None:
        self._held: dict[str, Counter[str]] = {}

    def held(self, model: str) -> int:
        return sum(self._held.get(model, Counter()).values())

    def refusal(self, model: str, tenant: str, limit: int) -> Literal["full", "tenant_share"] | None:
        """Why a request of `tenant` may not join `model`'s hold now, or None when it may."""
        by_tenant = self._held.get(model, Counter())
        if sum(by_tenant.values()) >= limit:
            return "full"
        others = len(by_tenant) - (tenant in by_tenant)
        if by_tenant[tenant] >= max(1, limit // (others + 2)):
            return "tenant_share"
        return None

    def add(self, model: str, tenant: str) -> None:
        self._held.setdefault(model, Counter())[tenant] += 1

    def remove(self, model: str, tenant: str) -> None:
        by_tenant = self._held[model]
        by_tenant[tenant] -= 1
        if not by_tenant[tenant]:
            del by_tenant[tenant]
        if not by_tenant:
            del self._held[model]
