"""/metrics names tenants and backend addresses: it is served on a port of its own, not to API clients."""
import subprocess
import sys

import httpx
import pytest

from fixtures.gateway import ADMIN_KEY, backend, free_port, gateway_config, key_entry, table
from sluice_gateway.config import GatewayConfig

KEY = "sk-test-metrics"


@pytest.mark.integration
def test_metrics_leave_the_api_port_for_their_own(start_gateway):
    tenants = [{"name": "tenant-secret-name", "keys": [key_entry("k", KEY)]}]
    gateway = start_gateway(gateway_config(tenants), table(m={"backends": [backend("b", "http://127.0.0.1:1")]}))

    for headers in ({}, {"authorization": f"Bearer {KEY}"}, {"authorization": f"Bearer {ADMIN_KEY}"}):
        response = httpx.get(f"{gateway.url}/metrics", headers=headers)
        assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_url"
        assert "127.0.0.1:1" not in response.text and "sluice_gateway" not in response.text
    # Probes stay open on the API port.
    assert httpx.get(f"{gateway.url}/health").status_code == 200
    assert httpx.get(f"{gateway.url}/ready").status_code == 200

    scraped = httpx.get(f"{gateway.metrics_url}/metrics")
    assert scraped.status_code == 200 and "sluice_gateway_ready 1.0" in scraped.text
    assert 'endpoint="http://127.0.0.1:1"' in scraped.text
    # The metrics listener serves metrics only: the API is not reachable through it.
    assert httpx.post(f"{gateway.metrics_url}/v1/chat/completions", json={}).status_code == 405


@pytest.mark.parametrize("config, fragment", [
    ({"metrics_port": 8080}, "must differ from listen.port"),
    ({"metrics_port": 9000, "listen": {"port": 9000}}, "must differ from listen.port"),
    ({"metrics_port": 70000}, "metrics_port"),
    ({"metrics_port": -1}, "metrics_port"),
    ({"metrics_port": "nine"}, "metrics_port"),
    ({"metrics_port": None}, "metrics_port"),
])
def test_metrics_port_is_validated(config, fragment):
    with pytest.raises(ValueError, match=fragment):
        GatewayConfig.model_validate(config)


def test_metrics_port_zero_turns_the_listener_off_and_defaults_to_9090():
    assert GatewayConfig().metrics_port == 9090
    assert GatewayConfig.model_validate({"metrics_port": 0, "listen": {"port": 0}}).metrics_port == 0


@pytest.mark.integration
def test_the_command_line_refuses_one_port_for_both(tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text("{}")
    port = str(free_port())
    result = subprocess.run(
        [sys.executable, "-m", "sluice_gateway.cli", "--config", str(config), "--host", "127.0.0.1",
         "--port", port, "--metrics-port", port], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "must differ from the API port" in result.stderr
