"""Limits for a single gateway replica, kept in this process."""
from __future__ import annotations

import time
from collections import deque

from ..config import Limits
from .base import WINDOW_S, Decision, Grant, Limiter, Usage, rejection, still_to_charge, unlimited

# A bucket holds one second, [s, s + 1); it counts until its end is a whole window old.
_SPAN_S = WINDOW_S + 1


class _Window:
    """Counts in one-second buckets: at most _SPAN_S (second, count) pairs, oldest first, with a running total."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()
        self.total = 0

    def live(self, now: float) -> deque[list[int]]:
        buckets = self.buckets
        while buckets and buckets[0][0] + _SPAN_S <= now:
            self.total -= buckets.popleft()[1]
        return buckets

    def add(self, now: float, amount: int) -> None:
        second = int(now)
        if self.buckets and self.buckets[-1][0] >= second:
            self.buckets[-1][1] += amount
        else:
            self.buckets.append([second, amount])
        self.total += amount


def wait_until_fits(live: deque[list[int]], excess: int, now: float) -> float:
    """Seconds until buckets holding `excess` have expired; a whole window if they never would."""
    for stamp, count in live:
        excess -= count
        if excess <= 0:
            return max(stamp + _SPAN_S - now, 0.0)
    return float(WINDOW_S)


class _TenantState:
    __slots__ = ("requests", "tokens", "reserved", "in_flight")

    def __init__(self) -> None:
        self.requests = _Window()
        self.tokens = _Window()
        self.reserved = 0  # reservations of requests in flight, not yet charged
        self.in_flight = 0


class MemoryLimiter(Limiter):
    def __init__(self) -> None:
        # One entry per configured tenant that has limits: callers only pass authenticated tenants.
        self._tenants: dict[str, _TenantState] = {}

    async def acquire(self, tenant: str, limits: Limits, tokens: int, at_least: int | None = None) -> Decision:
        if unlimited(limits):
            return Decision(grant=Grant(tenant, None, tokens, Usage()), usage=Usage())
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _TenantState()
        now = time.time()
        req_live, tok_live = state.requests.live(now), state.tokens.live(now)
        rpm, tpm, max_conc = limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrent
        tok_used = state.tokens.total + state.reserved
        usage = Usage(
            rpm, (rpm or 0) - state.requests.total, _reset(req_live, now),
            tpm, (tpm or 0) - tok_used, _reset(tok_live, now),
        )
        if rpm is not None and state.requests.total + 1 > rpm:
            return rejection("requests", rpm, wait_until_fits(req_live, state.requests.total + 1 - rpm, now),
                             usage, tokens)
        granted = tokens
        if tpm is not None and tok_used + tokens > tpm:
            left = tpm - tok_used
            if at_least is None or left < at_least:
                wait = wait_until_fits(tok_live, tok_used + tokens - tpm, now) if tokens <= tpm else WINDOW_S
                return rejection("tokens", tpm, wait, usage, tokens)
            granted = left
        if max_conc is not None and state.in_flight >= max_conc:
            return rejection("concurrency", max_conc, 1.0, usage, tokens)
        state.requests.add(now, 1)
        state.in_flight += 1
        counts_tokens = tpm is not None
        if counts_tokens:
            state.reserved += granted
        usage.remaining_requests -= 1
        usage.remaining_tokens -= granted
        usage.reset_requests_s = usage.reset_tokens_s = float(_SPAN_S)
        grant = Grant(tenant, "local", granted, usage, outstanding=granted if counts_tokens else 0,
                      counts_tokens=counts_tokens)
        return Decision(grant=grant, usage=usage)

    async def charge(self, grant: Grant, tokens: int) -> None:
        state = self._tenants.get(grant.tenant)
        if state is None or grant.lease is None or not grant.counts_tokens or tokens <= 0:
            return
        taken = min(tokens, grant.outstanding)
        grant.outstanding -= taken
        state.reserved -= taken
        state.tokens.add(time.time(), tokens)
        grant.charged += tokens

    async def finish(self, grant: Grant, actual_tokens: int | None) -> None:
        state = self._tenants.get(grant.tenant)
        if state is None or grant.lease is None:
            return
        grant.lease = None
        state.in_flight -= 1
        if grant.counts_tokens:
            rest = still_to_charge(grant, actual_tokens)
            state.reserved -= grant.outstanding
            grant.outstanding = 0
            if rest > 0:
                state.tokens.add(time.time(), rest)
                grant.charged += rest


def _reset(live: deque[list[int]], now: float) -> float:
    return max(live[-1][0] + _SPAN_S - now, 0.0) if live else 0.0
