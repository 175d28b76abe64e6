"""Safe defaults: a tenant that lists no models may use none, and admin keys are no inference keys. Real gateway
processes; the configs are written without the test helper, which would grant every model."""
import httpx
import pytest

from fixtures.gateway import ADMIN_KEY, backend, key_entry, table
from sluice_gateway.config import Tenant

KEY = "sk-test-defaults"
BODIES = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
          "/v1/completions": {"prompt": "Hi", "max_tokens": 1},
          "/v1/embeddings": {"input": "Hi"},
          "/v1/rerank": {"query": "Hi", "documents": ["a"]}}


def test_a_tenant_lists_no_model_by_default():
    assert Tenant(name="t", keys=[{"id": "k", "sha256": "0" * 64}]).models == ()


@pytest.mark.integration
def test_a_tenant_without_models_may_use_none_and_an_admin_key_serves_no_inference(tiny_runtimes, start_gateway):
    config = {"admin_keys": [key_entry("ops", ADMIN_KEY)],
              "tenants": [{"name": "no-models", "keys": [key_entry("k", KEY)], "limits": {"max_concurrent": 4}}]}
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]}))
    assert "no-models list no models" in gateway.log_text()
    for key, code in ((KEY, "model_not_allowed"), (ADMIN_KEY, "admin_key_not_allowed")):
        for path, body in BODIES.items():
            response = httpx.post(f"{gateway.url}{path}", json={"model": "tiny", **body}, timeout=30,
                                  headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 403, (key, path, response.text)
            assert response.json()["error"]["code"] == code
    listed = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert listed.status_code == 200 and listed.json()["data"] == []
    # The admin key still opens what it is for.
    admin = httpx.get(f"{gateway.url}/admin/routes", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    assert admin.status_code == 200
