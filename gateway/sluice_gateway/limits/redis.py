"""Limits shared by every gateway replica through Redis, the single source of truth.

Each decision is one Lua script run, so check-and-count is atomic across replicas, and it reads Redis's
clock, so replicas with skewed clocks agree. Keys carry a `{tenant}` hash tag (Redis Cluster friendly)
and expire when a tenant goes quiet. A request in flight holds a lease (its concurrency slot and the rest
of its token reservation) with the request's deadline, so a replica that dies mid-request frees them when
the deadline passes. A release that fails (Redis down or slow) is retried until it lands or the deadline
passes, also when it was the admission itself whose answer was lost after the script had run.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from ..config import Limits, RedisSettings
from .base import WINDOW_S, Decision, Grant, Limiter, LimiterUnavailable, Usage, rejection, still_to_charge, unlimited

log = logging.getLogger("sluice_gateway.limits")

# Shared by the scripts: the clock, and one-second buckets that count until their end is a window old.
_CLOCK = """
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_ms = now_s * 1000 + math.floor(tonumber(t[2]) / 1000)
local span_ms = (tonumber(ARGV[1]) + 1) * 1000
local function charge(key, amount)
  redis.call('HINCRBY', key, now_s, amount)
  redis.call('PEXPIRE', key, span_ms + 1000)
end
"""

# KEYS: requests hash, tokens hash, leases zset (lease -> deadline ms), reserved hash (lease -> tokens),
# reserved total, tombstone of this lease. ARGV: window, rpm, tpm, max_concurrent (0 = none), tokens,
# at_least (0 = none), lease, lease ttl ms. Returns {verdict, wait_ms, req_used, req_reset_ms, tok_used,
# tok_reset_ms, granted}; verdict 0 admitted, 1 requests, 2 tokens, 3 concurrency, 4 released already.
_ACQUIRE = _CLOCK + """
local rpm, tpm, maxc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local need, at_least, lease, lease_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
if redis.call('EXISTS', KEYS[6]) == 1 then return {4, 0, 0, 0, 0, 0, 0} end
local held = redis.call('ZSCORE', KEYS[3], lease)

local function live(key)
  local flat = redis.call('HGETALL', key)
  local used, entries, stale = 0, {}, {}
  for i = 1, #flat, 2 do
    local sec, n = tonumber(flat[i]), tonumber(flat[i + 1])
    if sec * 1000 + span_ms <= now_ms then
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

local function wait_ms(entries, excess)
  for _, e in ipairs(entries) do
    excess = excess - e[2]
    if excess <= 0 then return math.max(e[1] * 1000 + span_ms - now_ms, 0) end
  end
  return span_ms - 1000
end

local function reset_ms(entries)
  if #entries == 0 then return 0 end
  return math.max(entries[#entries][1] * 1000 + span_ms - now_ms, 0)
end

-- Leases past their deadline belong to requests that are gone (their replica died): drop their holds.
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms)
for _, gone in ipairs(expired) do
  local r = redis.call('HGET', KEYS[4], gone)
  if r then
    redis.call('DECRBY', KEYS[5], r)
    redis.call('HDEL', KEYS[4], gone)
  end
end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms) end

local req_used, req_entries = live(KEYS[1])
local tok_used, tok_entries = live(KEYS[2])
local reserved = tonumber(redis.call('GET', KEYS[5]) or '0')
tok_used = tok_used + reserved
local req_reset, tok_reset = reset_ms(req_entries), reset_ms(tok_entries)
if held then  -- a retried call of a request already admitted
  return {0, 0, req_used, req_reset, tok_used, tok_reset, tonumber(redis.call('HGET', KEYS[4], lease) or '0')}
end
if rpm > 0 and req_used + 1 > rpm then
  return {1, wait_ms(req_entries, req_used + 1 - rpm), req_used, req_reset, tok_used, tok_reset, 0}
end
local granted = need
if tpm > 0 and tok_used + need > tpm then
  local left = tpm - tok_used
  if at_least > 0 and left >= at_least then
    granted = left
  else
    local w = span_ms - 1000
    if need <= tpm then w = wait_ms(tok_entries, tok_used + need - tpm) end
    return {2, w, req_used, req_reset, tok_used, tok_reset, 0}
  end
end
if maxc > 0 and redis.call('ZCARD', KEYS[3]) >= maxc then
  return {3, 1000, req_used, req_reset, tok_used, tok_reset, 0}
end
charge(KEYS[1], 1)
if maxc > 0 or (tpm > 0 and granted > 0) then
  redis.call('ZADD', KEYS[3], now_ms + lease_ms, lease)
  redis.call('PEXPIRE', KEYS[3], lease_ms)
end
if tpm > 0 and granted > 0 then
  redis.call('HSET', KEYS[4], lease, granted)
  redis.call('INCRBY', KEYS[5], granted)
  redis.call('PEXPIRE', KEYS[4], lease_ms)
  redis.call('PEXPIRE', KEYS[5], lease_ms)
end
return {0, 0, req_used + 1, span_ms, tok_used + granted, span_ms, granted}
"""

# KEYS: tokens hash, reserved hash, reserved total. ARGV: window, lease, tokens produced since the last charge.
_CHARGE = _CLOCK + """
local n = tonumber(ARGV[3])
local r = redis.call('HGET', KEYS[2], ARGV[2])
if r then
  local taken = math.min(tonumber(r), n)
  redis.call('HINCRBY', KEYS[2], ARGV[2], -taken)
  redis.call('DECRBY', KEYS[3], taken)
end
charge(KEYS[1], n)
return 0
"""

# KEYS: tokens hash, reserved hash, reserved total, leases zset, tombstone. ARGV: window, lease, tokens to
# charge, tombstone ttl ms (0: none; set when the admission's answer was lost, so that a late-running
# admission of this lease is refused rather than holding a slot nobody will release).
_FINISH = _CLOCK + """
redis.call('ZREM', KEYS[4], ARGV[2])
local r = redis.call('HGET', KEYS[2], ARGV[2])
if r then
  redis.call('DECRBY', KEYS[3], r)
  redis.call('HDEL', KEYS[2], ARGV[2])
end
local n = tonumber(ARGV[3])
if n > 0 then charge(KEYS[1], n) end
local tombstone_ms = tonumber(ARGV[4])
if tombstone_ms > 0 then redis.call('SET', KEYS[5], 1, 'PX', tombstone_ms) end
return 0
"""

_VERDICTS = {1: "requests", 2: "tokens", 3: "concurrency"}
_RETRY_EVERY_S = 1.0
# Hand-backs kept for retrying while Redis is away; past this, the leases' deadlines free the rest.
_MAX_UNRELEASED = 10_000


class RedisLimiter(Limiter):
    def __init__(self, settings: RedisSettings, lease_ttl_s: float, prefix: str = "sluice:limits") -> None:
        tls = {"ssl_ca_certs": settings.tls_ca_file} if settings.tls_ca_file is not None else {}
        self._refused: str | None = None  # why Redis refuses the gateway (or would): its credentials
        try:
            password = settings.password()
        except ValueError as exc:
            password, self._refused = None, f"{exc}: the gateway cannot authenticate to Redis"
            log.error("%s", self._refused)
        if settings.tls_ca_file is not None and not os.path.isfile(settings.tls_ca_file):
            self._refused = f"redis.tls_ca_file {settings.tls_ca_file} is not a file: the gateway cannot verify Redis"
            log.error("%s", self._refused)
        self._unusable = self._refused is not None
        self._client = aioredis.Redis.from_url(
            settings.url,
            username=settings.username,
            password=password,
            **tls,
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            max_connections=256,
            # One immediate retry covers a pooled connection Redis had closed; beyond that the failure mode decides.
            retry=Retry(NoBackoff(), 1),
        )
        self._fail_open = settings.on_failure == "open"
        self._lease_ttl_s = lease_ttl_s
        self._prefix = prefix
        self._acquire = self._client.register_script(_ACQUIRE)
        self._charge = self._client.register_script(_CHARGE)
        self._finish = self._client.register_script(_FINISH)
        # Releases that could not reach Redis: lease -> (keys, args, deadline on the monotonic clock).
        self._unreleased: dict[str, tuple[list[str], list, float]] = {}
        self._retrier: asyncio.Task | None = None

    @property
    def client(self) -> aioredis.Redis:
        """The connection pool, for the gateway's other shared state (response_store.py)."""
        return self._client

    def not_ready_reason(self) -> str | None:
        """Set while Redis refuses the gateway's credentials: no retry fixes that, so the replica is not ready."""
        return self._refused

    def _note(self, exc: BaseException | None) -> None:
        if self._unusable:
            return  # its files said so at start; only a restart reads them again
        refused = isinstance(exc, AuthenticationError) or (
            isinstance(exc, ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS")))
        reason = (f"Redis refused the gateway's credentials ({exc}): set redis.password_file (and redis.username "
                  "for an ACL user) to what the server expects") if refused else None
        if reason is not None and reason != self._refused:
            log.error("%s", reason)
        elif reason is None and self._refused is not None and exc is None:
            log.info("Redis accepts the gateway's credentials again")
        if reason is not None or exc is None:
            self._refused = reason

    def _keys(self, tenant: str, lease: str) -> list[str]:
        base = f"{self._prefix}:{{{tenant}}}"
        return [f"{base}:requests", f"{base}:tokens", f"{base}:leases", f"{base}:reserved", f"{base}:reserved-total",
                f"{base}:released:{lease}"]

    async def acquire(self, tenant: str, limits: Limits, tokens: int, at_least: int | None = None) -> Decision:
        if unlimited(limits):
            return Decision(grant=Grant(tenant, None, tokens, Usage()), usage=Usage())
        if self._unusable:
            if not self._fail_open:
                raise LimiterUnavailable("the rate-limit store refused the gateway's credentials")
            return Decision(grant=Grant(tenant, None, tokens, Usage()), usage=Usage(), degraded=True)
        lease = uuid.uuid4().hex
        rpm, tpm, max_conc = limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrent
        keys = self._keys(tenant, lease)
        try:
            verdict, wait_ms, req_used, req_reset, tok_used, tok_reset, granted = await self._acquire(
                keys=keys, args=[WINDOW_S, rpm or 0, tpm or 0, max_conc or 0, tokens, at_least or 0, lease,
                                 int(self._lease_ttl_s * 1000)],
            )
        except (RedisError, OSError) as exc:
            self._note(exc)
            if self._refused is not None and not self._fail_open:
                raise LimiterUnavailable("the rate-limit store refused the gateway's credentials") from None
            if isinstance(exc, (RedisTimeout, TimeoutError)):
                # The script may have run and only its answer been lost: release the lease whatever happened.
                self._release_later(tenant, lease, 0, tombstone=True)
            if not self._fail_open:
                raise LimiterUnavailable(f"rate-limit store unreachable: {type(exc).__name__}") from None
            log.warning("redis unreachable, admitting tenant %s without limits (on_failure: open)", tenant)
            return Decision(grant=Grant(tenant, None, tokens, Usage()), usage=Usage(), degraded=True)
        self._note(None)
        usage = Usage(
            rpm, (rpm or 0) - req_used, req_reset / 1000,
            tpm, (tpm or 0) - tok_used, tok_reset / 1000,
        )
        if verdict:
            limit = {1: rpm, 2: tpm, 3: max_conc}[verdict]
            return rejection(_VERDICTS[verdict], limit, wait_ms / 1000, usage, tokens)
        counts_tokens = tpm is not None
        grant = Grant(tenant, lease, int(granted) if counts_tokens else tokens, usage,
                      outstanding=int(granted) if counts_tokens else 0, counts_tokens=counts_tokens)
        return Decision(grant=grant, usage=usage)

    async def charge(self, grant: Grant, tokens: int) -> None:
        if grant.lease is None or not grant.counts_tokens or tokens <= 0:
            return
        keys = self._keys(grant.tenant, grant.lease)
        try:
            await self._charge(keys=[keys[1], keys[3], keys[4]], args=[WINDOW_S, grant.lease, tokens])
        except (RedisError, OSError) as exc:
            # Not charged now: the tokens stay in the reservation and are charged when the request settles.
            log.warning("redis unreachable while charging tenant %s: %s", grant.tenant, type(exc).__name__)
            return
        grant.charged += tokens
        grant.outstanding = max(grant.outstanding - tokens, 0)

    async def finish(self, grant: Grant, actual_tokens: int | None) -> None:
        if grant.lease is None:
            return
        lease, grant.lease = grant.lease, None
        rest = still_to_charge(grant, actual_tokens) if grant.counts_tokens else 0
        keys, args = self._finish_call(grant.tenant, lease, rest, tombstone=False)
        try:
            await self._finish(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            log.warning("redis unreachable while settling a request of tenant %s: %s; retrying in the background",
                        grant.tenant, type(exc).__name__)
            self._release_later(grant.tenant, lease, rest, tombstone=False)

    def _finish_call(self, tenant: str, lease: str, tokens: int, *, tombstone: bool) -> tuple[list[str], list]:
        keys = self._keys(tenant, lease)
        ttl_ms = int(self._lease_ttl_s * 1000) if tombstone else 0
        return [keys[1], keys[3], keys[4], keys[2], keys[5]], [WINDOW_S, lease, tokens, ttl_ms]

    def _release_later(self, tenant: str, lease: str, tokens: int, *, tombstone: bool) -> None:
        if len(self._unreleased) >= _MAX_UNRELEASED:
            return
        keys, args = self._finish_call(tenant, lease, tokens, tombstone=tombstone)
        self._unreleased[lease] = (keys, args, time.monotonic() + self._lease_ttl_s)
        if self._retrier is None or self._retrier.done():
            self._retrier = asyncio.get_running_loop().create_task(self._retry_releases())

    async def _retry_releases(self) -> None:
        """Until every failed release has landed, or its lease's deadline has freed it anyway."""
        while self._unreleased:
            await asyncio.sleep(_RETRY_EVERY_S)
            now = time.monotonic()
            for lease, (keys, args, deadline) in list(self._unreleased.items()):
                if deadline <= now:
                    del self._unreleased[lease]
                    continue
                try:
                    await self._finish(keys=keys, args=args)
                except (RedisError, OSError):
                    break  # still down: try again later
                del self._unreleased[lease]

    async def close(self) -> None:
        if self._retrier is not None:
            self._retrier.cancel()
        await self._client.aclose()
