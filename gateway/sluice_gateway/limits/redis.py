"""Limits shared by every gateway replica through Redis, the single source of truth.

Each decision is one Lua script run, so check-and-count is atomic across replicas, and it reads Redis's
clock, so replicas with skewed clocks agree. Keys carry a `{tenant}` hash tag (Redis Cluster friendly)
and expire when a tenant goes quiet; concurrency slots are leases with a deadline, so a replica that
dies mid-request frees its slots when their deadline passes instead of leaking them forever.
"""
from __future__ import annotations

import logging
import uuid

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..config import Limits, RedisSettings
from .base import WINDOW_S, Decision, Grant, Limiter, LimiterUnavailable, Usage, rejection, unlimited

log = logging.getLogger("sluice_gateway.limits")

# KEYS: requests hash, tokens hash, leases zset. ARGV: window, rpm, tpm, max_concurrent (0 = none),
# tokens, lease id, lease ttl ms. Returns {verdict, wait_ms, req_used, req_reset_ms, tok_used, tok_reset_ms,
# bucket}; verdict 0 admitted, 1 requests, 2 tokens, 3 concurrency.
_ACQUIRE = """
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_ms = now_s * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local rpm, tpm, maxc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local need = tonumber(ARGV[5])

local function live(key)
  local flat = redis.call('HGETALL', key)
  local used, entries, stale = 0, {}, {}
  for i = 1, #flat, 2 do
    local sec, n = tonumber(flat[i]), tonumber(flat[i + 1])
    if sec <= now_s - window then
      stale[#stale + 1] = flat[i]
    elseif n > 0 then
      used = used + n
      entries[#entries + 1] = {sec, n}
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  table.sort(entries, function(a, b) return a[1] < b[1] end)
  return used, entries
end

local function wait_ms(entries, used, amount, limit)
  local excess = used + amount - limit
  for _, e in ipairs(entries) do
    excess = excess - e[2]
    if excess <= 0 then return math.max((e[1] + window) * 1000 - now_ms, 0) end
  end
  return window * 1000
end

local function reset_ms(entries)
  if #entries == 0 then return 0 end
  return math.max((entries[#entries][1] + window) * 1000 - now_ms, 0)
end

local req_used, req_entries = live(KEYS[1])
local tok_used, tok_entries = live(KEYS[2])
local req_reset, tok_reset = reset_ms(req_entries), reset_ms(tok_entries)
if rpm > 0 and req_used + 1 > rpm then
  return {1, wait_ms(req_entries, req_used, 1, rpm), req_used, req_reset, tok_used, tok_reset, now_s}
end
if tpm > 0 and tok_used + need > tpm then
  local w = window * 1000
  if need <= tpm then w = wait_ms(tok_entries, tok_used, need, tpm) end
  return {2, w, req_used, req_reset, tok_used, tok_reset, now_s}
end
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[3]) >= maxc then
    return {3, 1000, req_used, req_reset, tok_used, tok_reset, now_s}
  end
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[7]), ARGV[6])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]))
end
local ttl = (window + 1) * 1000
redis.call('HINCRBY', KEYS[1], now_s, 1)
redis.call('PEXPIRE', KEYS[1], ttl)
if need > 0 then
  redis.call('HINCRBY', KEYS[2], now_s, need)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {0, 0, req_used + 1, window * 1000, tok_used + need, window * 1000, now_s}
"""

# KEYS: tokens hash, leases zset. ARGV: bucket, token delta, lease id.
_FINISH = """
redis.call('ZREM', KEYS[2], ARGV[3])
local delta = tonumber(ARGV[2])
if delta ~= 0 and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local left = redis.call('HINCRBY', KEYS[1], ARGV[1], delta)
  if left < 0 then redis.call('HSET', KEYS[1], ARGV[1], 0) end
end
return 0
"""

_VERDICTS = {1: "requests", 2: "tokens", 3: "concurrency"}


class RedisLimiter(Limiter):
    def __init__(self, settings: RedisSettings, lease_ttl_s: float, prefix: str = "sluice:limits") -> None:
        self._client = aioredis.Redis.from_url(
            settings.url,
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            max_connections=256,
            # One immediate retry covers a pooled connection Redis had closed; beyond that the failure mode decides.
            retry=Retry(NoBackoff(), 1),
        )
        self._fail_open = settings.on_failure == "open"
        self._lease_ttl_ms = int(lease_ttl_s * 1000)
        self._prefix = prefix
        self._acquire = self._client.register_script(_ACQUIRE)
        self._finish = self._client.register_script(_FINISH)

    def _keys(self, tenant: str) -> list[str]:
        base = f"{self._prefix}:{{{tenant}}}"
        return [f"{base}:requests", f"{base}:tokens", f"{base}:leases"]

    async def acquire(self, tenant: str, limits: Limits, tokens: int) -> Decision:
        if unlimited(limits):
            return Decision(grant=Grant(tenant, None, 0, 0, Usage()), usage=Usage())
        lease = uuid.uuid4().hex
        rpm, tpm, max_conc = limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrent
        try:
            verdict, wait_ms, req_used, req_reset, tok_used, tok_reset, bucket = await self._acquire(
                keys=self._keys(tenant),
                args=[WINDOW_S, rpm or 0, tpm or 0, max_conc or 0, tokens, lease, self._lease_ttl_ms],
            )
        except (RedisError, OSError) as exc:
            if not self._fail_open:
                raise LimiterUnavailable(f"rate-limit store unreachable: {type(exc).__name__}") from None
            log.warning("redis unreachable, admitting tenant %s without limits (on_failure: open)", tenant)
            return Decision(grant=Grant(tenant, None, 0, 0, Usage()), usage=Usage(), degraded=True)
        usage = Usage(
            rpm, (rpm or 0) - req_used, req_reset / 1000,
            tpm, (tpm or 0) - tok_used, tok_reset / 1000,
        )
        if verdict:
            limit = {1: rpm, 2: tpm, 3: max_conc}[verdict]
            return rejection(_VERDICTS[verdict], limit, wait_ms / 1000, usage, tokens)
        return Decision(grant=Grant(tenant, lease, int(bucket), tokens, usage), usage=usage)

    async def finish(self, grant: Grant, actual_tokens: int | None) -> None:
        if grant.lease is None:
            return
        delta = 0 if actual_tokens is None else actual_tokens - grant.reserved_tokens
        _, tokens_key, leases_key = self._keys(grant.tenant)
        try:
            await self._finish(keys=[tokens_key, leases_key], args=[grant.bucket, delta, grant.lease])
        except (RedisError, OSError) as exc:
            # The lease deadline frees the slot; the reservation simply stands.
            log.warning("redis unreachable while settling a request of tenant %s: %s", grant.tenant, type(exc).__name__)

    async def close(self) -> None:
        await self._client.aclose()
