"""A gateway whose files are bad at start waits, not ready, for good ones instead of crash-looping."""
import time

import httpx
import pytest
import yaml

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-not-ready"
GOOD = gateway_config([{"name": "team", "keys": [key_entry("team-key", KEY)]}], routing={"reload_interval_s": 0.1})


def wait_until(condition, what: str, timeout: float = 15):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("bad_config, reason", [
    ("tenants: [{name: team, keys: [", "is not valid YAML"),
    (yaml.safe_dump({**GOOD, "tenants": [{"name": "team", "keys": [{"id": "k", "sha256": KEY}]}]}),
     "tenants.0.keys.0.sha256"),
])
def test_a_config_that_cannot_be_used_at_start_serves_nothing_until_it_is_fixed(start_gateway, bad_config, reason):
    gateway = start_gateway(bad_config, table(), wait_for="/health")
    ready = httpx.get(f"{gateway.url}/ready")
    assert ready.status_code == 503 and ready.json()["error"] == {
        "message": "no valid config file yet", "type": "service_unavailable", "param": None, "code": "not_ready"}
    # No config, no keys: nothing is served, whatever key is sent.
    models = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {KEY}"})
    assert models.status_code == 401 and models.json()["error"]["code"] == "invalid_api_key"
    assert gateway.metric("sluice_gateway_ready") == 0
    assert gateway.metric("sluice_gateway_file_rejected", file="config") == 1
    assert gateway.metric("sluice_gateway_config_rejections_total") == 1
    assert reason in gateway.log_text() and "serving nothing until it is fixed" in gateway.log_text()

    gateway.write_config(GOOD)
    wait_until(lambda: httpx.get(f"{gateway.url}/ready").status_code == 200, "the fixed config to be read")
    assert httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert gateway.metric("sluice_gateway_ready") == 1
    assert gateway.metric("sluice_gateway_file_rejected", file="config") == 0
    assert gateway.process.poll() is None


def test_a_malformed_routing_table_at_start_leaves_the_gateway_not_ready_until_it_is_fixed(start_gateway):
    broken = table(1, chat={"backends": [backend("b", "http://127.0.0.1:1")], "fallbacks": ["nowhere"]})
    gateway = start_gateway(GOOD, broken, wait_for="/health")
    ready = httpx.get(f"{gateway.url}/ready")
    assert ready.status_code == 503 and ready.json()["error"]["message"] == "no valid routes file yet"
    assert gateway.metric("sluice_gateway_file_rejected", file="routes") == 1
    assert gateway.metric("sluice_gateway_routing_table_rejections_total") == 1
    assert "unknown route 'nowhere'" in gateway.log_text()
    assert "not ready until a valid table arrives" in gateway.log_text()

    gateway.write_routes(table(2, chat={"backends": [backend("b", "http://127.0.0.1:1")]}))
    wait_until(lambda: httpx.get(f"{gateway.url}/ready").status_code == 200, "the fixed table to be read")
    assert httpx.get(f"{gateway.url}/ready").json()["generation"] == 2
    assert gateway.metric("sluice_gateway_file_rejected", file="routes") == 0
