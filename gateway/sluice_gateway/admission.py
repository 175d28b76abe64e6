"""One request's hold on its tenant's limits: admitted with a reservation, charged as it streams, settled once."""
from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from .auth import Principal
from .cost import Reservation
from .errors import GatewayError
from .limits import Grant, Limiter, LimiterUnavailable
from .metrics import GatewayMetrics

# How often a long stream's tokens so far are charged to the window they were produced in.
CHARGE_EVERY_S = 5.0
LOWERED_HEADER = b"x-sluice-max-tokens-lowered"
# A choice delta with text or a tool call: each carries at least one new token (an empty role-only delta, the
# closing delta and the usage event carry none), so counting them never charges more than was produced.
_TOKEN_DELTA = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")|"tool_calls"\s*:\s*\[')


class Admission:
    def __init__(self, limiter: Limiter, metrics: GatewayMetrics) -> None:
        self._limiter = limiter
        self._metrics = metrics
        self.grant: Grant | None = None
        self._streamed = 0
        self._last_charge = 0.0
        self._charging: asyncio.Task | None = None

    async def admit(
        self, principal: Principal, reservation: Reservation, payload: dict[str, Any], response_headers: list,
    ) -> None:
        """Take the request's hold, or raise 429/503; lowers the payload's max_tokens where the tenant says so."""
        limits = principal.limits
        lowerable = reservation.lowerable and limits.over_budget == "lower_max_tokens"
        at_least = reservation.tokens_with(1) if lowerable else None
        try:
            decision = await self._limiter.acquire(principal.tenant, limits, reservation.tokens, at_least)
        except LimiterUnavailable as exc:
            self._metrics.limiter_errors.inc()
            raise GatewayError(503, f"{exc}; try again shortly", code="limiter_unavailable",
                               headers=[(b"retry-after", b"1")]) from None
        if decision.degraded:
            self._metrics.limiter_errors.inc()
        response_headers.extend(decision.usage.headers())
        if decision.grant is None:
            self._metrics.limit_rejections.labels(principal.tenant, decision.rejected).inc()
            raise GatewayError(429, decision.message, code="rate_limit_exceeded",
                               headers=[(b"retry-after", decision.retry_after_header)])
        self.grant = decision.grant
        self._last_charge = time.monotonic()
        if decision.grant.reserved_tokens < reservation.tokens:
            lowered = reservation.max_tokens_within(decision.grant.reserved_tokens)
            _set_max_tokens(payload, lowered)
            response_headers.append((LOWERED_HEADER, str(lowered).encode()))

    def streamed(self, body: bytes) -> None:
        """Count the tokens in a chunk of the stream sent to the client; charge them every CHARGE_EVERY_S."""
        grant = self.grant
        if grant is None or not grant.counts_tokens:
            return
        self._streamed += len(_TOKEN_DELTA.findall(body))
        now = time.monotonic()
        if now - self._last_charge < CHARGE_EVERY_S or (self._charging is not None and not self._charging.done()):
            return
        produced = self._streamed - grant.charged
        if produced > 0:
            self._last_charge = now
            self._charging = asyncio.get_running_loop().create_task(self._limiter.charge(grant, produced))

    async def settle(self, prompt_tokens: Any, completion_tokens: Any, status: int) -> None:
        """Hand the hold back with what the request used, whatever the upstream reported."""
        grant, self.grant = self.grant, None
        if grant is None:
            return
        if self._charging is not None:
            await asyncio.gather(self._charging, return_exceptions=True)
        await self._limiter.finish(grant, used_tokens(prompt_tokens, completion_tokens, status))


def used_tokens(prompt_tokens: Any, completion_tokens: Any, status: int) -> int | None:
    """The request's real usage; 0 when it certainly generated nothing; None when unknown (charged in full)."""
    if is_count(prompt_tokens) and (completion_tokens is None or is_count(completion_tokens)):
        return prompt_tokens + (completion_tokens or 0)
    if 400 <= status < 499 or status == 503:  # refused before generating: by the gateway or the runtime
        return 0
    return None


def is_count(value: Any) -> bool:
    """A token count as the limiter takes one from an upstream: a plain non-negative JSON integer (no bool, no
    float, nothing past what a JSON number holds exactly)."""
    return type(value) is int and 0 <= value < 1 << 53


def _set_max_tokens(payload: dict[str, Any], value: int) -> None:
    given = [name for name in ("max_completion_tokens", "max_tokens") if payload.get(name) is not None]
    for name in given or ["max_tokens"]:
        payload[name] = value
