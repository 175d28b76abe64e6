"""No Prometheus label value comes from a client: made-up model names, refused or unknown, on every endpoint,
leave /metrics as it was (a page that grows without bound outlasts the operator's demand-fetch timeout)."""
import uuid

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

NARROW, WIDE = "sk-test-labels-narrow", "sk-test-labels-wide"
PATHS = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
         "/v1/completions": {"prompt": "Hi", "max_tokens": 1},
         "/v1/embeddings": {"input": "Hi"},
         "/v1/rerank": {"query": "Hi", "documents": ["a"]}}


def test_made_up_model_names_do_not_grow_the_metrics_page(tiny_runtimes, start_gateway):
    config = gateway_config([
        {"name": "narrow", "keys": [key_entry("narrow-key", NARROW)], "models": ["tiny"]},
        {"name": "wide", "keys": [key_entry("wide-key", WIDE)], "models": ["*"]},
    ])
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]}))

    def refused_once_each() -> None:
        with httpx.Client(timeout=30) as client:
            for path, body in PATHS.items():
                for key, status in ((NARROW, 403), (WIDE, 404)):
                    name = f"made-up-{uuid.uuid4().hex}" + "x" * 200
                    response = client.post(f"{gateway.url}{path}", json={"model": name, **body},
                                           headers={"authorization": f"Bearer {key}"})
                    assert response.status_code == status, response.text

    refused_once_each()  # every series these refusals touch exists from here on
    before = httpx.get(f"{gateway.metrics_url}/metrics", timeout=30).text
    for _ in range(25):  # 200 requests, each with its own name
        refused_once_each()
    after = httpx.get(f"{gateway.metrics_url}/metrics", timeout=30).text
    assert "made-up" not in after
    assert len(after) - len(before) < 2000, len(after) - len(before)  # counts grow, not series
    assert gateway.metric("sluice_gateway_requests_total", route="unknown", status="403") == 4 * 26
