"""Stored Responses (`store: true`): each under its tenant, for `GET /v1/responses/{id}` and
`previous_response_id`, until `responses.store_ttl_s` passes.

They live where the gateway's limits live: in Redis when `redis` is configured (every replica reads what any
wrote), else in this process's memory. A record is the response object the client got and the conversation
that led to it as chat messages (what a follow-up continues from).
"""
from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from redis.exceptions import RedisError

from .errors import GatewayError

log = logging.getLogger("sluice_gateway")

# What the gateway makes ids of: any other id is no stored response, without a look-up.
RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{32}$")
# Of a replica's memory, what stored responses may take: the oldest go first past it (a store without Redis keeps
# what fits; the chart's gateway container is limited to 512 MiB).
MEMORY_BYTES = 64 << 20


class ResponseStore:
    """In this process's memory, or in Redis through `client` (the limiter's connection pool)."""

    def __init__(self, ttl_s: int, client: Any = None, prefix: str = "sluice:responses",
                 memory_bytes: int = MEMORY_BYTES) -> None:
        self._ttl_s = ttl_s
        self._client = client
        self._prefix = prefix
        self._memory: dict[tuple[str, str], tuple[float, str]] = {}
        self._memory_bytes = memory_bytes
        self._held = 0

    async def put(self, tenant: str, response_id: str, record: dict[str, Any]) -> None:
        text = json.dumps(record, separators=(",", ":"))
        if self._client is None:
            now = time.monotonic()
            if (old := self._memory.pop((tenant, response_id), None)) is not None:
                self._held -= len(old[1])
            self._memory[(tenant, response_id)] = (now + self._ttl_s, text)
            self._held += len(text)
            # One TTL for all: insertion order is expiry order, so the expired, and the oldest, are at the front.
            while self._memory and (next(iter(self._memory.values()))[0] <= now or self._held > self._memory_bytes):
                self._held -= len(self._memory.pop(next(iter(self._memory)))[1])
            return
        try:
            await self._client.set(self._key(tenant, response_id), text, ex=self._ttl_s)
        except (RedisError, OSError) as exc:
            # The answer has gone out; only its later retrieval is lost.
            log.warning("response %s not stored: Redis failed: %s", response_id, exc)

    async def get(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        if not RESPONSE_ID.match(response_id):
            return None
        if self._client is None:
            held = self._memory.get((tenant, response_id))
            if held is None or held[0] <= time.monotonic():
                return None
            return json.loads(held[1])
        try:
            text = await self._client.get(self._key(tenant, response_id))
        except (RedisError, OSError):
            raise GatewayError(503, "the store of responses is unavailable; try again", code="store_unavailable",
                               headers=[(b"retry-after", b"1")]) from None
        return None if text is None else json.loads(text)

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Whether this tenant had that response stored (it has not any more)."""
        if not RESPONSE_ID.match(response_id):
            return False
        if self._client is None:
            held = self._memory.pop((tenant, response_id), None)
            if held is not None:
                self._held -= len(held[1])
            return held is not None and held[0] > time.monotonic()
        try:
            return bool(await self._client.delete(self._key(tenant, response_id)))
        except (RedisError, OSError):
            raise GatewayError(503, "the store of responses is unavailable; try again", code="store_unavailable",
                               headers=[(b"retry-after", b"1")]) from None

    def _key(self, tenant: str, response_id: str) -> str:
        # The tenant's name is length-prefixed, so no name and id can spell another tenant's key.
        return f"{self._prefix}:{len(tenant)}:{tenant}:{response_id}"


def not_found(response_id: str, param: str | None = None) -> GatewayError:
    """A response this tenant has not stored, whether another has or none: told alike."""
    return GatewayError(404, f"No response with id '{response_id}' found", param=param, code="response_not_found")
