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


KEEP, REVOKE = "sk-test-keep", "sk-test-revoke"


def tenants_config(*keys: tuple[str, str], **overrides) -> dict:
    return gateway_config([{"name": "team", "keys": [key_entry(key_id, key) for key_id, key in keys]}],
                          routing={"reload_interval_s": 0.1}, **overrides)


def models_status(gateway, key: str) -> int:
    return httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {key}"}).status_code


def wait_until(condition, what: str, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_key_removed_from_the_config_is_refused_without_a_restart(start_gateway):
    gateway = start_gateway(tenants_config(("keep", KEEP), ("revoke", REVOKE)), table())
    assert models_status(gateway, KEEP) == 200 and models_status(gateway, REVOKE) == 200

    gateway.write_config(tenants_config(("keep", KEEP)))
    wait_until(lambda: models_status(gateway, REVOKE) == 401, "the revoked key to be refused")
    assert models_status(gateway, KEEP) == 200
    assert gateway.process.poll() is None, "no restart"
    assert "gateway config reloaded: 1 tenants" in gateway.log_text()


@pytest.mark.parametrize("bad_edit, reason", [
    ("tenants: [: not yaml", "not valid YAML"),
    ("tenants: [{name: team, keys: [{id: keep, sha256: sk-test-keep}]}]", "64-character hex SHA-256"),
    ("tenants: [{name: team, keys: []}]", "tenants.0.keys"),
    ("tenants: {name: team}", "tenants"),
    ("[]", "(top level)"),
    ("timeouts: {total_s: .inf}", "timeouts.total_s"),
])
def test_a_bad_config_edit_keeps_the_last_good_config(start_gateway, bad_edit, reason):
    gateway = start_gateway(tenants_config(("keep", KEEP), ("revoke", REVOKE)), table())
    gateway.write_config(bad_edit)
    wait_until(lambda: gateway.metric("sluice_gateway_config_rejections_total") == 1, "the rejection")
    assert gateway.metric("sluice_gateway_file_rejected", file="config") == 1
    assert models_status(gateway, KEEP) == 200 and models_status(gateway, REVOKE) == 200
    assert httpx.get(f"{gateway.url}/ready").status_code == 200, "the last good config still serves"
    log = gateway.log_text()
    assert reason in log and "keeping the previous one" in log

    gateway.write_config(tenants_config(("keep", KEEP)))
    wait_until(lambda: models_status(gateway, REVOKE) == 401, "the next good config to apply")
    assert gateway.metric("sluice_gateway_file_rejected", file="config") == 0


def test_settings_bound_at_start_wait_for_a_restart_and_say_so(start_gateway):
    gateway = start_gateway(tenants_config(("keep", KEEP)), table())
    gateway.write_config(tenants_config(("keep", KEEP), ("new", REVOKE), listen={"port": 1}, metrics_port=2))
    wait_until(lambda: models_status(gateway, REVOKE) == 200, "the new key to be accepted")
    assert "changes to listen, metrics_port take effect at the next restart" in gateway.log_text()
    assert httpx.get(f"{gateway.metrics_url}/metrics").status_code == 200
