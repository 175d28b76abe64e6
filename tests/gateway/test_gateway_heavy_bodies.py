"""One tenant's heavy bodies (a few MB of many small keys) do not stall the gateway for another tenant: they
are parsed off the event loop, and a body past the element bound is refused. A real gateway process."""
import json
import statistics
import threading
import time

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

HEAVY, LIGHT = "sk-test-heavy", "sk-test-light"
# 300,000 keys, 3.5 MB: the shape that cost the event loop about a second each.
HEAVY_BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                         "metadata": {f"{i:06d}": 1 for i in range(300_000)}}).encode()


def light_latencies(url: str, count: int) -> list[float]:
    """Another tenant's requests, one at a time: each is answered by the gateway alone (its model is unknown)."""
    times = []
    with httpx.Client(timeout=30) as client:
        for _ in range(count):
            started = time.perf_counter()
            response = client.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {LIGHT}"},
                                   json={"model": "nothing-here", "messages": [{"role": "user", "content": "Hi"}]})
            times.append(time.perf_counter() - started)
            assert response.status_code == 404
    return times


def p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98]


def test_heavy_bodies_of_one_tenant_leave_anothers_latency_low(tiny_runtimes, start_gateway):
    config = gateway_config([
        # The heavy tenant may not use the model: its bodies are parsed, then refused, and reach no runtime.
        {"name": "heavy", "keys": [key_entry("heavy-key", HEAVY)], "models": ["other"]},
        {"name": "light", "keys": [key_entry("light-key", LIGHT)], "models": ["*"]},
    ], max_body_bytes=8 * 1024 * 1024)
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]}))
    alone = light_latencies(gateway.url, 100)
    stop, statuses = threading.Event(), []

    def flood() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                statuses.append(client.post(f"{gateway.url}/v1/chat/completions", content=HEAVY_BODY, headers={
                    "authorization": f"Bearer {HEAVY}", "content-type": "application/json"}).status_code)

    floods = [threading.Thread(target=flood) for _ in range(2)]
    for thread in floods:
        thread.start()
    try:
        time.sleep(1)
        during = light_latencies(gateway.url, 100)
    finally:
        stop.set()
        for thread in floods:
            thread.join()
    assert statuses and set(statuses) == {403}, statuses
    # On the loop, each heavy body held every other request for most of a second.
    assert p99(during) < 0.3, (p99(alone), p99(during), len(statuses))

    # Past the element bound: refused, whatever the nesting.
    too_many = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                           "metadata": [[0] * 1000] * 600}).encode()
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=too_many, timeout=60,
                          headers={"authorization": f"Bearer {LIGHT}", "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
