"""Limits held exactly by two gateway processes sharing one real redis-server, and what happens when it dies."""
import asyncio
import collections

import httpx
import openai
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from fixtures.redis import start_redis

pytestmark = pytest.mark.integration

KEY = "sk-test-shared"
HEADERS = {"authorization": f"Bearer {KEY}"}


def chat(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **extra}


def config(redis_url: str, tenant_name: str, on_failure: str = "closed", **limits) -> dict:
    # Fail closed with a generous timeout: on a busy test machine a slow Redis reply must not pass as an outage.
    tenants = [{"name": tenant_name, "keys": [key_entry(f"{tenant_name}-key", KEY)], "limits": limits}]
    return gateway_config(tenants, redis={"url": redis_url, "on_failure": on_failure, "timeout_s": 10})


async def burst(urls: list[str], count: int, body: dict) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=count)) as client:
        return await asyncio.gather(*(
            client.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=body, headers=HEADERS)
            for i in range(count)
        ))


def test_requests_per_minute_is_exact_across_two_gateways(redis_server, tiny_runtimes, start_gateway):
    routes = table(tiny={"backends": [backend("b", tiny_runtimes[0].url, tiny_runtimes[1].url)]})
    gateways = [start_gateway(config(redis_server.url, "rpm-tenant", requests_per_minute=25), routes)
                for _ in range(2)]
    responses = asyncio.run(burst([g.url for g in gateways], 80, chat()))
    statuses = collections.Counter(r.status_code for r in responses)
    assert statuses == {200: 25, 429: 55}, statuses
    refused = [r for r in responses if r.status_code == 429]
    assert all(1 <= int(r.headers["retry-after"]) <= 61 for r in refused)  # a bucket counts until its end is 60 s old
    assert all(r.headers["x-ratelimit-limit-requests"] == "25" for r in refused)
    assert all(r.headers["x-ratelimit-remaining-requests"] == "0" for r in refused)
    assert {r.json()["error"]["code"] for r in refused} == {"rate_limit_exceeded"}

    client = openai.OpenAI(base_url=f"{gateways[1].url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**chat())
    assert sum(g.metric("sluice_gateway_limit_rejections_total", limit="requests") for g in gateways) == 56


def test_concurrency_slots_are_shared_and_always_returned(redis_server, tiny_runtimes, start_gateway):
    routes = table(tiny={"backends": [backend("b", tiny_runtimes[0].url, tiny_runtimes[1].url)]})
    gateways = [start_gateway(config(redis_server.url, "slot-tenant", max_concurrent=3), routes) for _ in range(2)]
    long = chat(max_tokens=60, ignore_eos=True)
    for _ in range(2):
        responses = asyncio.run(burst([g.url for g in gateways], 30, long))
        statuses = collections.Counter(r.status_code for r in responses)
        assert statuses[200] >= 3 and statuses[200] + statuses[429] == 30, statuses
        codes = {r.json()["error"]["message"] for r in responses if r.status_code == 429}
        assert all("concurrent" in message for message in codes)
    # After every burst all slots are back: three long requests at once are all admitted.
    responses = asyncio.run(burst([g.url for g in gateways], 3, long))
    assert [r.status_code for r in responses] == [200, 200, 200]


@pytest.mark.parametrize("on_failure, expected", [("open", 200), ("closed", 503)])
def test_redis_outage_fails_open_or_closed_as_configured(on_failure, expected, tiny_runtimes, start_gateway):
    routes = table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]})
    with start_redis() as redis:
        gateway = start_gateway(config(redis.url, "outage", on_failure, requests_per_minute=100), routes)
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), headers=HEADERS).status_code == 200
        redis.stop()
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), headers=HEADERS, timeout=30)
        assert response.status_code == expected, response.text
        if expected == 503:
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["code"] == "limiter_unavailable"
        assert gateway.metric("sluice_gateway_limiter_errors_total") == 1
