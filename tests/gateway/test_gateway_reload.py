"""The routing table changes under a running gateway: bad tables are refused, good ones apply with no loss."""
import asyncio
import collections
import time

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-reload"
HEADERS = {"authorization": f"Bearer {KEY}"}
CONFIG = gateway_config([{"name": "reload", "keys": [key_entry("reload-key", KEY)]}],
                        routing={"reload_interval_s": 0.1})


def chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


def generation(gateway) -> int:
    return httpx.get(f"{gateway.url}/ready").json()["generation"]


def test_malformed_table_is_rejected_and_the_last_good_one_stays(tiny_runtimes, start_gateway):
    a = tiny_runtimes[0].url
    gateway = start_gateway(CONFIG, table(1, chat={"backends": [backend("v1", a)]}))

    gateway.write_routes("{ this is not a routing table")
    bad_fallback = table(2, chat={"backends": [backend("v1", a)], "fallbacks": ["nowhere"]})
    deadline = time.monotonic() + 10
    while gateway.metric("sluice_gateway_routing_table_rejections_total") < 1:
        assert time.monotonic() < deadline, "the malformed table was never looked at"
        time.sleep(0.05)
    gateway.write_routes(bad_fallback)
    while gateway.metric("sluice_gateway_routing_table_rejections_total") < 2:
        assert time.monotonic() < deadline, "the table with an unknown fallback was never looked at"
        time.sleep(0.05)

    assert generation(gateway) == 1
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("chat"), headers=HEADERS).status_code == 200
    log = gateway.log_text()
    assert "rejected, keeping the previous one" in log and "unknown route 'nowhere'" in log

    gateway.write_routes(table(3, renamed={"backends": [backend("v1", a)]}))
    while generation(gateway) != 3:
        assert time.monotonic() < deadline, "the valid table was not applied"
        time.sleep(0.05)
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("renamed"), headers=HEADERS).status_code == 200
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("chat"), headers=HEADERS).status_code == 404


def test_hot_reload_under_load_loses_no_request(tiny_runtimes, start_gateway):
    a, b = (server.url for server in tiny_runtimes)
    tables = [
        table(1, chat={"backends": [backend("blue", a)]}),
        table(2, chat={"backends": [backend("green", b)]}),
        table(3, chat={"backends": [backend("blue", a, weight=1), backend("green", b, weight=1)]}),
    ]
    gateway = start_gateway(CONFIG, tables[0])

    written = [1]

    async def load() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            results: list[httpx.Response] = []

            async def worker():
                for _ in range(30):
                    results.append(await client.post("/v1/chat/completions", json=chat("chat"), headers=HEADERS))

            async def reloader():
                # Swap tables every 24 answers, so reloads interleave with the load however fast it runs.
                while len(results) < 360:
                    if len(results) >= 24 * len(written):
                        written.append(written[-1] + 1)
                        gateway.write_routes({**tables[written[-1] % 3], "generation": written[-1]})
                    await asyncio.sleep(0.005)

            await asyncio.gather(reloader(), *(worker() for _ in range(12)))
            return results

    results = asyncio.run(load())
    statuses = collections.Counter(r.status_code for r in results)
    assert statuses == {200: 360}, statuses
    assert {r.headers["x-sluice-backend"] for r in results} == {"blue", "green"}
    deadline = time.monotonic() + 10
    assert len(written) > 10, "too few reloads happened during the load"
    while generation(gateway) != written[-1]:
        assert time.monotonic() < deadline, "the last table was not applied"
        time.sleep(0.05)
