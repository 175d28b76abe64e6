"""Limits for a single gateway replica, kept in this process."""
from __future__ import annotations

import time
from collections import deque

from ..config import Limits
from .base import WINDOW_S, Decision, Grant, Limiter, Usage, rejection, unlimited


class _Window:
    """Counts in one-second buckets over the last WINDOW_S seconds: at most WINDOW_S (second, count) pairs,
    oldest first, with a running total so the common check is O(1)."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()
        self.total = 0

    def live(self, now_s: int) -> deque[list[int]]:
        buckets = self.buckets
        while buckets and buckets[0][0] <= now_s - WINDOW_S:
            self.total -= buckets.popleft()[1]
        return buckets

    def add(self, now_s: int, amount: int) -> None:
        if self.buckets and self.buckets[-1][0] >= now_s:
            self.buckets[-1][1] += amount
        else:
            self.buckets.append([now_s, amount])
        self.total += amount

    def adjust(self, bucket: int, delta: int, now_s: int) -> None:
        for entry in self.live(now_s):
            if entry[0] == bucket:
                change = max(delta, -entry[1])
                entry[1] += change
                self.total += change
                return


def wait_until_fits(live: deque[list[int]], used: int, need: int, limit: int, now: float) -> float:
    """Seconds until enough old buckets expire for `need` more to fit under `limit`."""
    excess = used + need - limit
    for stamp, count in live:
        excess -= count
        if excess <= 0:
            return max(stamp + WINDOW_S - now, 0.0)
    return float(WINDOW_S)


class _TenantState:
    __slots__ = ("requests", "tokens", "in_flight")

    def __init__(self) -> None:
        self.requests = _Window()
        self.tokens = _Window()
        self.in_flight = 0


class MemoryLimiter(Limiter):
    def __init__(self) -> None:
        # One entry per configured tenant that has limits: callers only pass authenticated tenants.
        self._tenants: dict[str, _TenantState] = {}

    async def acquire(self, tenant: str, limits: Limits, tokens: int) -> Decision:
        if unlimited(limits):
            return Decision(grant=Grant(tenant, None, 0, 0, Usage()), usage=Usage())
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _TenantState()
        now = time.time()
        now_s = int(now)
        req_live = state.requests.live(now_s)
        tok_live = state.tokens.live(now_s)
        req_used, tok_used = state.requests.total, state.tokens.total
        usage = Usage(
            limits.requests_per_minute, (limits.requests_per_minute or 0) - req_used, _reset(req_live, now),
            limits.tokens_per_minute, (limits.tokens_per_minute or 0) - tok_used, _reset(tok_live, now),
        )
        rpm, tpm, max_conc = limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrent
        if rpm is not None and req_used + 1 > rpm:
            return rejection("requests", rpm, wait_until_fits(req_live, req_used, 1, rpm, now), usage, tokens)
        if tpm is not None and tok_used + tokens > tpm:
            wait = wait_until_fits(tok_live, tok_used, tokens, tpm, now) if tokens <= tpm else float(WINDOW_S)
            return rejection("tokens", tpm, wait, usage, tokens)
        if max_conc is not None and state.in_flight >= max_conc:
            return rejection("concurrency", max_conc, 1.0, usage, tokens)
        state.requests.add(now_s, 1)
        state.tokens.add(now_s, tokens)
        state.in_flight += 1
        usage.remaining_requests -= 1
        usage.remaining_tokens -= tokens
        usage.reset_requests_s = usage.reset_tokens_s = float(WINDOW_S)
        return Decision(grant=Grant(tenant, "local", now_s, tokens, usage), usage=usage)

    async def finish(self, grant: Grant, actual_tokens: int | None) -> None:
        state = self._tenants.get(grant.tenant)
        if state is None or grant.lease is None:
            return
        state.in_flight -= 1
        if actual_tokens is not None:
            state.tokens.adjust(grant.bucket, actual_tokens - grant.reserved_tokens, int(time.time()))


def _reset(live: deque[list[int]], now: float) -> float:
    return max(live[-1][0] + WINDOW_S - now, 0.0) if live else 0.0
