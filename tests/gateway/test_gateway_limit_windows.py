"""The per-minute limits over real minutes: no second minute across a bucket boundary, and tokens counted in the
minute they were served, also for a stream longer than a minute. Two gateway processes share one redis-server."""
import asyncio
import json
import threading
import time

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from sluice_gateway.request import (
    TEMPLATE_TOKENS_PER_CHAT,
    TEMPLATE_TOKENS_PER_ELEMENT,
    TEMPLATE_TOKENS_PER_MESSAGE,
)

pytestmark = pytest.mark.integration

KEY = "sk-test-windows"
HEADERS = {"authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "Hi"}]
# The gateway's upper bound of that prompt (sluice_gateway.request): the bytes of its strings, keys included, an
# allowance for the message and each of its members, one per message and one per chat request.
HI_PROMPT_BOUND = (len("role" "user" "content" "Hi") + 3 * TEMPLATE_TOKENS_PER_ELEMENT + TEMPLATE_TOKENS_PER_MESSAGE
                   + TEMPLATE_TOKENS_PER_CHAT)


def config(redis_url: str | None, tenant_name: str, **limits) -> dict:
    tenants = [{"name": tenant_name, "keys": [key_entry(f"{tenant_name}-key", KEY)], "limits": limits}]
    if redis_url is None:
        return gateway_config(tenants)
    return gateway_config(tenants, redis={"url": redis_url, "on_failure": "closed", "timeout_s": 10})


async def burst(urls: list[str], count: int) -> list[int]:
    body = {"model": "tiny", "messages": HI, "max_tokens": 1}
    async with httpx.AsyncClient(timeout=60) as client:
        responses = await asyncio.gather(*(
            client.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=body, headers=HEADERS)
            for i in range(count)))
    return [r.status_code for r in responses]


def sleep_until(wall_clock: float) -> None:
    time.sleep(max(wall_clock - time.time(), 0))


def test_five_requests_a_minute_never_become_ten_across_a_bucket_boundary(redis_server, tiny_runtimes,
                                                                          start_gateway):
    routes = table(tiny={"backends": [backend("b", *(r.url for r in tiny_runtimes))]})
    limiters = {
        "memory": [start_gateway(config(None, "rpm-memory", requests_per_minute=5), routes).url],
        "redis": [start_gateway(config(redis_server.url, "rpm-redis", requests_per_minute=5), routes).url
                  for _ in range(2)],
    }

    async def everywhere() -> dict[str, list[int]]:
        results = await asyncio.gather(*(burst(urls, 5) for urls in limiters.values()))
        return dict(zip(limiters, results))

    # Five late in a second: a window of whole seconds would forget them when the next minute's second began,
    # 59.2 s later.
    second = int(time.time()) + 1
    sleep_until(second + 0.85)
    assert asyncio.run(everywhere()) == {"memory": [200] * 5, "redis": [200] * 5}
    assert time.time() < second + 60, "five requests took a minute: the machine is too busy for this test"
    sleep_until(second + 60.05)
    assert asyncio.run(everywhere()) == {"memory": [429] * 5, "redis": [429] * 5}, time.time() - second
    # Once the first five are a minute old, the next five are admitted (the refused ones used nothing).
    sleep_until(second + 62.2)
    assert asyncio.run(everywhere()) == {"memory": [200] * 5, "redis": [200] * 5}


TPM = 20_000
# A stream of 15,200 tokens: over a minute on a busy 2-core machine (100 s measured), seconds on a fast one.
LONG = {"model": "tiny", "messages": HI, "max_tokens": 1900, "n": 8, "ignore_eos": True}
LONG_RESERVATION = HI_PROMPT_BOUND + 8 * 1900


def long_stream(url: str, received: list[tuple[float, int]]) -> tuple[float, dict]:
    """Stream the long request, noting when each token arrived; returns when it was admitted, and its usage."""
    body = {**LONG, "stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=600) as response:
        assert response.status_code == 200, response.read()
        admitted = time.time()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[len("data: "):])
                usage = event.get("usage") or usage
                tokens = sum(1 for choice in event["choices"] if choice["delta"].get("content"))
                if tokens:
                    received.append((time.time(), tokens))
    return admitted, usage


def short_requests(url: str, until: float, received: list[tuple[float, int]]) -> None:
    body = {"model": "tiny", "messages": HI, "max_tokens": 100, "ignore_eos": True}
    while time.time() < until:
        response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60)
        if response.status_code == 200:
            received.append((time.time(), response.json()["usage"]["total_tokens"]))
        else:
            assert response.status_code == 429, response.text
            time.sleep(1)


def most_in_a_minute(received: list[tuple[float, int]]) -> int:
    """The most tokens received in any 60 s: a window opening at each arrival, closing 60 s later."""
    received = sorted(received)
    most = inside = end = 0
    for start, tokens in received:
        while end < len(received) and received[end][0] < start + 60:
            inside += received[end][1]
            end += 1
        most = max(most, inside)
        inside -= tokens
    return most


def admitted_now(url: str) -> httpx.Response:
    """Whether another long request would be admitted (if it is, it is cancelled at once)."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**LONG, "stream": True}, headers=HEADERS,
                      timeout=60) as response:
        return response


def test_tokens_count_in_the_minute_they_were_served_also_for_a_stream_longer_than_a_minute(
        redis_server, tiny_runtimes, start_gateway):
    # Each gateway has its own runtime (so the two loads do not share a KV cache); both share the tenant's limits.
    streaming, other = (start_gateway(config(redis_server.url, "tpm-redis", tokens_per_minute=TPM),
                                      table(tiny={"backends": [backend("b", runtime.url)]}))
                        for runtime in tiny_runtimes)
    received: list[tuple[float, int]] = []
    started = time.time()
    # Short requests through the other gateway take what the stream leaves, for the stream's first 45 s.
    shorts = threading.Thread(target=short_requests, args=(other.url, started + 45, received))
    shorts.start()
    admitted, usage = long_stream(streaming.url, received)
    ended = time.time()
    # A minute after the stream was admitted, or when it ended if it took longer, the tokens it produced in the
    # last minute still count: another such request must wait, through either gateway. (Counted at admission,
    # they would have left the window a minute after it, and a settlement after that would be lost.)
    sleep_until(admitted + 62)
    again = admitted_now(other.url)
    shorts.join()
    assert usage["completion_tokens"] == 8 * 1900
    assert again.status_code == 429, (ended - admitted, again.headers)
    assert int(again.headers["x-ratelimit-remaining-tokens"]) < LONG_RESERVATION
    # Over any 60 s the tenant was served at most its tokens per minute, plus one request's reservation.
    assert most_in_a_minute(received) <= TPM + LONG_RESERVATION
