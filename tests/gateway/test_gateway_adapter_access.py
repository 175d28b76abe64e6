"""Tenants' allow-lists apply to adapter names like any model name, tried as a hostile tenant would: a key allowed
only the base model reaches no adapter of it, not by naming it, nor through a canary, nor by spelling it otherwise.

The table is written here as the operator writes it; the adapter backend points at a tiny runtime's base model
(servedModelName) since only the gateway's choice is under test, read back from `x-sluice-backend`."""
import json

import httpx
import pytest

from fixtures.gateway import TINY_MODEL_NAME, gateway_config, key_entry, run_gateway, table

pytestmark = pytest.mark.integration

BASE_ONLY, SQL_ONLY, CHAT_AND_BASE, CHAT_ONLY, EVERYTHING = (
    "sk-test-base-only", "sk-test-sql-only", "sk-test-chat-base", "sk-test-chat-only", "sk-test-everything")
HI = [{"role": "user", "content": "Hi"}]


def _backend(urls: list[str], adapter: str | None = None, weight: int = 1) -> dict:
    entry = {"name": "base", "servedModelName": TINY_MODEL_NAME, "weight": weight, "endpoints": urls}
    return {**entry, "adapter": adapter} if adapter else entry


@pytest.fixture(scope="module")
def gateway(tiny_runtimes, tmp_path_factory):
    urls = [tiny_runtimes[0].url]
    tenants = [{"name": name, "keys": [key_entry(f"{name}-key", key)], "models": models}
               for name, key, models in [("base-only", BASE_ONLY, ["base"]), ("sql-only", SQL_ONLY, ["sql-v1"]),
                                         ("chat-base", CHAT_AND_BASE, ["chat", "base"]),
                                         ("chat-only", CHAT_ONLY, ["chat"]), ("everything", EVERYTHING, ["*"])]]
    routes = table(
        base={"backends": [_backend(urls)]},
        **{"sql-v1": {"backends": [_backend(urls, "sql-v1")]}},
        # Nine requests in ten to the adapter, for whoever may use it.
        chat={"backends": [_backend(urls, weight=1), _backend(urls, "sql-v1", weight=9)]},
    )
    with run_gateway(gateway_config(tenants), routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def post(gateway, key: str, model: str, raw: bytes | None = None) -> httpx.Response:
    body = raw if raw is not None else json.dumps({"model": model, "messages": HI, "max_tokens": 1}).encode()
    return httpx.post(f"{gateway.url}/v1/chat/completions", content=body, timeout=120,
                      headers={"authorization": f"Bearer {key}", "content-type": "application/json"})


def listed(gateway, key: str) -> list[str]:
    answer = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {key}"}).json()
    return [m["id"] for m in answer["data"]]


def test_adapters_are_public_names_served_to_the_keys_that_may_use_them(gateway):
    assert listed(gateway, EVERYTHING) == ["base", "chat", "sql-v1"]
    served = post(gateway, SQL_ONLY, "sql-v1")
    assert served.status_code == 200 and served.headers["x-sluice-backend"] == "sql-v1"
    # Counted under the InferenceModel, as scale to zero reads the demand, with the adapter in the access log.
    metrics = httpx.get(f"{gateway.metrics_url}/metrics").text
    assert 'sluice_gateway_requests_total{backend="base",route="sql-v1",status="200",tenant="sql-only"}' in metrics
    request_id = served.headers["x-sluice-request-id"]
    line = gateway.access_lines(request_id)[request_id]
    assert (line["backend"], line["adapter"]) == ("base", "sql-v1")
    assert listed(gateway, SQL_ONLY) == ["sql-v1"]
    assert post(gateway, SQL_ONLY, "base").status_code == 403


@pytest.mark.parametrize("model", ["sql-v1", "SQL-V1", " sql-v1", "sql-v1 ", "sql-v1\n", "base/sql-v1", "base:sql-v1",
                                   "base sql-v1", "sql\u2010v1", "sql-v1\u200b"])
def test_a_key_allowed_only_the_base_model_cannot_name_its_adapter(gateway, model):
    refused = post(gateway, BASE_ONLY, model)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "model_not_allowed"


def test_a_key_allowed_only_the_base_model_lists_no_adapter_and_a_doubled_model_field_smuggles_none(gateway):
    assert listed(gateway, BASE_ONLY) == ["base"]
    for raw in (b'{"model": "base", "model": "sql-v1", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}',
                b'{"model": "sql-v1", "model": "base", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}'):
        answer = post(gateway, BASE_ONLY, "", raw)
        assert answer.status_code == 403 or answer.headers["x-sluice-backend"] == "base", answer.text


def test_a_canary_to_an_adapter_never_serves_a_key_that_may_not_use_the_adapter(gateway):
    backends = [post(gateway, CHAT_AND_BASE, "chat") for _ in range(12)]
    assert [(r.status_code, r.headers.get("x-sluice-backend")) for r in backends] == [(200, "base")] * 12
    # Allowed the route alone: its backends are models (and an adapter) it may not use, so nothing serves it.
    refused = post(gateway, CHAT_ONLY, "chat")
    assert refused.status_code == 403 and "Every backend" in refused.json()["error"]["message"]
    # Whoever may use the adapter gets it through the canary.
    served = {post(gateway, EVERYTHING, "chat").headers["x-sluice-backend"] for _ in range(12)}
    assert "sql-v1" in served
