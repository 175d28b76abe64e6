"""Per-tenant limits on both backends: exact counts under concurrency, reservations and settlement, slots,
Redis outages."""
import asyncio
import uuid

import pytest
from pydantic import ValidationError

from fixtures.redis import start_redis
from sluice_gateway.config import Limits, RedisSettings
from sluice_gateway.limits import LimiterUnavailable
from sluice_gateway.limits.memory import MemoryLimiter
from sluice_gateway.limits.redis import RedisLimiter


@pytest.fixture(params=["memory", "redis"])
async def limiter(request):
    if request.param == "memory":
        lim = MemoryLimiter()
    else:
        redis = request.getfixturevalue("redis_server")
        lim = RedisLimiter(RedisSettings(url=redis.url, timeout_s=10), lease_ttl_s=60)
    yield lim
    await lim.close()


def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


async def test_requests_per_minute_is_exact_under_concurrency(limiter):
    name, limits = tenant(), Limits(requests_per_minute=7)
    decisions = await asyncio.gather(*(limiter.acquire(name, limits, 1) for _ in range(20)))
    admitted = [d for d in decisions if d.grant]
    rejected = [d for d in decisions if not d.grant]
    assert len(admitted) == 7
    assert {d.rejected for d in rejected} == {"requests"}
    assert all(0 < d.retry_after_s <= 61 for d in rejected)  # a bucket counts until its end is 60 s old
    assert sorted(d.usage.remaining_requests for d in admitted) == list(range(7))
    headers = dict(rejected[0].usage.headers())
    assert headers[b"x-ratelimit-limit-requests"] == b"7"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"


async def test_tokens_are_reserved_then_reconciled_with_real_usage(limiter):
    name, limits = tenant(), Limits(tokens_per_minute=1000)
    first = await limiter.acquire(name, limits, 600)
    assert first.grant and first.usage.remaining_tokens == 400
    second = await limiter.acquire(name, limits, 600)
    assert second.rejected == "tokens" and "1000 tokens per minute" in second.message
    await limiter.finish(first.grant, actual_tokens=100)
    third = await limiter.acquire(name, limits, 600)
    assert third.grant and third.usage.remaining_tokens == 300


async def test_tokens_are_charged_as_produced_and_the_rest_of_the_reservation_released(limiter):
    name, limits = tenant(), Limits(tokens_per_minute=1000)
    grant = (await limiter.acquire(name, limits, 600)).grant
    await limiter.charge(grant, 200)  # a stream so far: moved from the reservation to the window
    assert grant.charged == 200 and grant.outstanding == 400
    assert (await limiter.acquire(name, limits, 401)).rejected == "tokens"
    await limiter.finish(grant, actual_tokens=500)  # 300 more than charged, the other 100 released
    assert (await limiter.acquire(name, limits, 500)).usage.remaining_tokens == 0
    assert (await limiter.acquire(name, limits, 1)).rejected == "tokens"


async def test_unknown_usage_charges_the_whole_reservation(limiter):
    name, limits = tenant(), Limits(tokens_per_minute=1000)
    grant = (await limiter.acquire(name, limits, 600)).grant
    await limiter.finish(grant, actual_tokens=None)
    assert (await limiter.acquire(name, limits, 401)).rejected == "tokens"
    assert (await limiter.acquire(name, limits, 400)).grant


async def test_a_reservation_is_lowered_to_what_is_left_only_when_asked(limiter):
    name, limits = tenant(), Limits(tokens_per_minute=1000)
    assert (await limiter.acquire(name, limits, 700)).grant
    assert (await limiter.acquire(name, limits, 500)).rejected == "tokens"
    lowered = await limiter.acquire(name, limits, 500, at_least=100)
    assert lowered.grant.reserved_tokens == 300 and lowered.usage.remaining_tokens == 0
    assert (await limiter.acquire(name, limits, 500, at_least=1)).rejected == "tokens"


async def test_request_larger_than_the_token_limit_says_so(limiter):
    decision = await limiter.acquire(tenant(), Limits(tokens_per_minute=100), 500)
    assert decision.rejected == "tokens" and "Request too large" in decision.message


async def test_concurrency_slots_are_released_by_finish(limiter):
    name, limits = tenant(), Limits(max_concurrent=2)
    grants = [(await limiter.acquire(name, limits, 1)).grant for _ in range(2)]
    assert all(grants)
    blocked = await limiter.acquire(name, limits, 1)
    assert blocked.rejected == "concurrency" and blocked.retry_after_header == b"1"
    await limiter.finish(grants[0], actual_tokens=None)
    assert (await limiter.acquire(name, limits, 1)).grant


async def test_rejected_requests_consume_nothing(limiter):
    name, limits = tenant(), Limits(requests_per_minute=3, max_concurrent=1)
    held = (await limiter.acquire(name, limits, 1)).grant
    for _ in range(5):
        assert (await limiter.acquire(name, limits, 1)).rejected == "concurrency"
    await limiter.finish(held, 1)
    assert (await limiter.acquire(name, limits, 1)).usage.remaining_requests == 1


@pytest.mark.integration
async def test_two_redis_clients_share_one_exact_limit(redis_server):
    a = RedisLimiter(RedisSettings(url=redis_server.url, timeout_s=10), lease_ttl_s=60)
    b = RedisLimiter(RedisSettings(url=redis_server.url, timeout_s=10), lease_ttl_s=60)
    name, limits = tenant(), Limits(requests_per_minute=40, max_concurrent=1000)
    decisions = await asyncio.gather(*((a if i % 2 else b).acquire(name, limits, 1) for i in range(150)))
    assert sum(1 for d in decisions if d.grant) == 40
    await a.close()
    await b.close()


@pytest.mark.integration
async def test_redis_lease_of_a_dead_replica_expires(redis_server):
    lim = RedisLimiter(RedisSettings(url=redis_server.url, timeout_s=10), lease_ttl_s=0.3)
    name, limits = tenant(), Limits(max_concurrent=1)
    assert (await lim.acquire(name, limits, 1)).grant  # never finished: its replica "died"
    assert (await lim.acquire(name, limits, 1)).rejected == "concurrency"
    await asyncio.sleep(0.4)
    assert (await lim.acquire(name, limits, 1)).grant
    await lim.close()


@pytest.mark.integration
@pytest.mark.parametrize("on_failure", ["open", "closed"])
async def test_redis_outage_follows_the_configured_failure_mode(on_failure):
    with start_redis() as redis:
        lim = RedisLimiter(RedisSettings(url=redis.url, on_failure=on_failure, timeout_s=0.2), lease_ttl_s=60)
        limits = Limits(requests_per_minute=1)
        assert (await lim.acquire("t", limits, 1)).grant
        redis.stop()
        if on_failure == "open":
            decision = await lim.acquire("t", limits, 1)
            assert decision.grant is not None
            await lim.finish(decision.grant, 5)
        else:
            with pytest.raises(LimiterUnavailable):
                await lim.acquire("t", limits, 1)
        await lim.close()


def test_over_budget_takes_only_the_documented_choices():
    assert Limits().over_budget == "refuse"
    with pytest.raises(ValidationError) as err:
        Limits(over_budget="borrow")
    assert "'refuse' or 'lower_max_tokens'" in str(err.value)
