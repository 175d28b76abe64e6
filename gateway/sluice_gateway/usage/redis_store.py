"""Usage counted in Redis, the connection the limits use: every replica adds to the same hour hashes, so a read
from any replica covers all of them, and the counts outlive every gateway restart (as long as Redis keeps its
data: persistence is Redis's own setting).

A replica adds its requests up in memory and flushes them every FLUSH_S in one script run. Each flush has an
id that the script records: a flush whose answer was lost is sent again as it was, and counted once. While
Redis is away the counts wait in memory (one number per cell) and go with the next flush that lands.
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import Counter

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .counts import BUCKET_S, KEPT_S, Cell
from .store import UsageStore, UsageUnavailable

log = logging.getLogger("sluice_gateway.usage")

FLUSH_S = 1.0
# A flush's id outlives any resend of it by far.
_FLUSH_ID_TTL_S = 24 * 3600

# KEYS[1]: this flush's id, KEYS[2..]: hour hashes. ARGV: id ttl s, hash ttl s, then (key index, field, amount)
# triples. Returns 1 when counted now, 0 when this flush had been counted already.
_FLUSH = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
for i = 3, #ARGV, 3 do
  redis.call('HINCRBY', KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
end
for i = 2, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
return 1
"""


class RedisUsage(UsageStore):
    shared = True

    def __init__(self, client: aioredis.Redis, prefix: str = "sluice:usage") -> None:
        self._client = client
        # One hash tag for every usage key: a flush touches several hours in one script (Redis Cluster friendly).
        self._prefix = f"{prefix}:{{usage}}"
        self._flush = client.register_script(_FLUSH)
        self._pending: Counter[Cell] = Counter()
        self._sending: tuple[str, Counter[Cell]] | None = None  # a flush not yet known to have landed

    def add(self, cells: dict[Cell, int]) -> None:
        self._pending.update(cells)

    async def read(self, first_hour: int, last_hour: int) -> dict[Cell, int]:
        hours = range(first_hour, last_hour + 1, BUCKET_S)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for hour in hours:
                    pipe.hgetall(self._hour_key(hour))
                answers = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise UsageUnavailable(f"the usage store (Redis) cannot be read: {type(exc).__name__}") from None
        cells: dict[Cell, int] = {}
        for hour, fields in zip(hours, answers):
            for field, count in fields.items():
                tenant, model, mode, kind = json.loads(field)
                cells[Cell(hour, tenant, model, mode, kind)] = int(count)
        return cells

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def flush(self) -> bool:
        """Send what was counted since the last flush that landed; whether everything has landed now."""
        if self._sending is None:
            if not self._pending:
                return True
            self._sending, self._pending = (uuid.uuid4().hex, self._pending), Counter()
        flush_id, cells = self._sending
        keys = [f"{self._prefix}:flush:{flush_id}"]
        index: dict[int, int] = {}
        args: list[str | int] = [_FLUSH_ID_TTL_S, KEPT_S]
        for cell, count in cells.items():
            if cell.hour not in index:
                index[cell.hour] = len(keys) + 1  # Lua counts from 1
                keys.append(self._hour_key(cell.hour))
            args += [index[cell.hour], json.dumps([cell.tenant, cell.model, cell.mode, cell.kind]), count]
        try:
            await self._flush(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            log.warning("usage counts not written to Redis (%s); kept for the next flush", type(exc).__name__)
            return False
        self._sending = None
        return not self._pending

    def _hour_key(self, hour: int) -> str:
        return f"{self._prefix}:{hour}"

    async def close(self) -> None:
        """A last flush, so a replica stopped in order loses none of its counts (the connection is the limiter's)."""
        for _ in range(2):  # the one in flight, then what came after it
            if await self.flush():
                return
