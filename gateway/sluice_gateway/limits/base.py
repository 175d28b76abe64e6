"""What a limiter decides, and the interface both backends implement (the rule is in limits/__init__.py)."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..config import Limits

WINDOW_S = 60


@dataclass(slots=True)
class Usage:
    """What the `x-ratelimit-*` headers report after a decision."""

    limit_requests: int | None = None
    remaining_requests: int = 0
    reset_requests_s: float = 0.0
    limit_tokens: int | None = None
    remaining_tokens: int = 0
    reset_tokens_s: float = 0.0

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = []
        if self.limit_requests is not None:
            out += [
                (b"x-ratelimit-limit-requests", str(self.limit_requests).encode()),
                (b"x-ratelimit-remaining-requests", str(max(self.remaining_requests, 0)).encode()),
                (b"x-ratelimit-reset-requests", _duration(self.reset_requests_s)),
            ]
        if self.limit_tokens is not None:
            out += [
                (b"x-ratelimit-limit-tokens", str(self.limit_tokens).encode()),
                (b"x-ratelimit-remaining-tokens", str(max(self.remaining_tokens, 0)).encode()),
                (b"x-ratelimit-reset-tokens", _duration(self.reset_tokens_s)),
            ]
        return out


@dataclass(slots=True)
class Grant:
    """An admitted request's hold on its tenant's limits; `Limiter.finish` hands it back exactly once."""

    tenant: str
    lease: str | None  # names the hold in the store; None: nothing to hand back
    reserved_tokens: int  # what the request was granted (its max_tokens was lowered to fit if less than asked)
    usage: Usage
    outstanding: int = 0  # the part of the reservation not yet charged
    charged: int = 0  # tokens already charged to the window while the request ran
    counts_tokens: bool = False  # the tenant has a token limit


@dataclass(slots=True)
class Decision:
    grant: Grant | None
    usage: Usage
    rejected: str | None = None  # "requests", "tokens" or "concurrency"
    retry_after_s: float = 0.0
    message: str = ""
    degraded: bool = False  # admitted without checking because the shared store is down (fail open)

    @property
    def retry_after_header(self) -> bytes:
        return str(max(1, math.ceil(self.retry_after_s))).encode()


class LimiterUnavailable(Exception):
    """The shared store cannot be reached and the config says to fail closed."""


class Limiter(ABC):
    @abstractmethod
    async def acquire(self, tenant: str, limits: Limits, tokens: int, at_least: int | None = None) -> Decision:
        """Check every limit and, only if all pass, count the request, reserve `tokens` and take a slot.

        With `at_least`, a request whose `tokens` do not fit is granted what is left of the budget instead,
        if that is at least `at_least`.
        """

    @abstractmethod
    async def charge(self, grant: Grant, tokens: int) -> None:
        """Count `tokens` the request has produced so far against the current second, out of its reservation."""

    @abstractmethod
    async def finish(self, grant: Grant, actual_tokens: int | None) -> None:
        """Free the slot and the rest of the reservation, charging what the request used beyond what was
        already charged (None: unknown, so the whole reservation is charged)."""

    async def close(self) -> None:
        return None


def unlimited(limits: Limits) -> bool:
    return limits.requests_per_minute is None and limits.tokens_per_minute is None and limits.max_concurrent is None


def still_to_charge(grant: Grant, actual_tokens: int | None) -> int:
    if actual_tokens is None:
        return grant.outstanding
    return max(actual_tokens - grant.charged, 0)


def rejection(kind: str, limit: int, wait_s: float, usage: Usage, tokens: int) -> Decision:
    if kind == "requests":
        message = f"Rate limit reached: {limit} requests per minute. Retry after {math.ceil(wait_s)} s."
    elif kind == "tokens" and tokens > limit:
        message = (
            f"Request too large: it may use up to {tokens} tokens (prompt and max_tokens for every choice) but the"
            f" limit is {limit} tokens per minute. Lower max_tokens, n or the prompt."
        )
    elif kind == "tokens":
        message = (
            f"Rate limit reached: {limit} tokens per minute, and this request may use up to {tokens} tokens,"
            f" more than is left. Retry after {math.ceil(wait_s)} s or lower max_tokens."
        )
    else:
        message = f"Too many concurrent requests: the limit is {limit} at a time."
    return Decision(grant=None, usage=usage, rejected=kind, retry_after_s=wait_s, message=message)


def _duration(seconds: float) -> bytes:
    """OpenAI's reset format: `1s`, `6m0s`, `250ms`."""
    if seconds < 1:
        return f"{max(int(seconds * 1000), 0)}ms".encode()
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return (f"{minutes}m{secs}s" if minutes else f"{secs}s").encode()
