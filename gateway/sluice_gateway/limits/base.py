"""What a limiter decides, and the interface both backends implement."""
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
    """An admitted request's reservation; hand it back to `Limiter.finish` exactly once."""

    tenant: str
    lease: str | None
    bucket: int
    reserved_tokens: int
    usage: Usage


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
    async def acquire(self, tenant: str, limits: Limits, tokens: int) -> Decision:
        """Check every limit and, only if all pass, count the request, reserve `tokens` and take a slot."""

    @abstractmethod
    async def finish(self, grant: Grant, actual_tokens: int | None) -> None:
        """Free the concurrency slot and replace the token reservation by the real count (None: keep it)."""

    async def close(self) -> None:
        return None


def unlimited(limits: Limits) -> bool:
    return limits.requests_per_minute is None and limits.tokens_per_minute is None and limits.max_concurrent is None


def rejection(kind: str, limit: int, wait_s: float, usage: Usage, tokens: int) -> Decision:
    if kind == "requests":
        message = f"Rate limit reached: {limit} requests per minute. Retry after {math.ceil(wait_s)} s."
    elif kind == "tokens" and tokens > limit:
        message = (
            f"Request too large: it needs about {tokens} tokens (prompt estimate plus max_tokens) but the limit"
            f" is {limit} tokens per minute. Lower max_tokens or shorten the prompt."
        )
    elif kind == "tokens":
        message = f"Rate limit reached: {limit} tokens per minute. Retry after {math.ceil(wait_s)} s."
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
